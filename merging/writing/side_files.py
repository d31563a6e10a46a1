"""The small files copied from the base folder next to the merged weights, and nothing else.

Copied: config.json (rewritten with the output dtype), generation_config.json, tokenizer files and chat
templates, named in an allow-list — what `transformers` and vLLM need to load and prompt the model.
Each must pass the model folder's containment rule (`model_folder.check_file`: a regular file inside the
base folder or its Hub blob store, not a hard link to anything else) and be no larger than MAX_SIDE_FILE.
They are checked before a merge starts (`plan_side_files`), and copied at its end only if each is still the
file that was checked (same device, inode, size and modification time).
"""
from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path

from merging.common.dtypes import CODE_TO_NAME, FLOAT_CODES
from merging.common.errors import RamStudioError, printable
from merging.common.untrusted import loads_json
from merging.reading.checkpoint import Checkpoint
from merging.reading.model_folder import FileIdentity, check_file, open_checked

SIDE_FILE_PATTERNS = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                      "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
                      "*.tiktoken", "chat_template.json", "chat_template.jinja", "preprocessor_config.json",
                      "processor_config.json", "video_preprocessor_config.json", "image_processor_config.json",
                      "feature_extractor_config.json", "audio_processor_config.json")
MAX_SIDE_FILE = 64 << 20


def is_side_file(name: str) -> bool:
    """Whether a file name is on the allow-list (config.json is written separately)."""
    return any(fnmatch.fnmatchcase(name, p) for p in SIDE_FILE_PATTERNS)


def plan_side_files(base: Checkpoint) -> list[FileIdentity]:
    """The allow-listed files of the base folder, each checked now (before any work): a link out of the
    folder, a FIFO, a hard link or an oversized file is an error here, not after the merge ran."""
    planned = []
    for src in sorted(base.folder.iterdir(), key=lambda p: p.name):
        if not is_side_file(src.name):
            continue
        try:
            planned.append(check_file(base.folder, src.name, max_bytes=MAX_SIDE_FILE))
        except FileNotFoundError:
            if not os.path.islink(src):
                raise RamStudioError(f"{src} disappeared while the base folder was read.") from None
            continue  # a dangling link: nothing to copy
        except RamStudioError as exc:
            raise RamStudioError(f"not copying {printable(src.name, 80)} from the base: {exc.message}",
                                 exc.hint) from None
    return planned


def output_config(config: dict, dtype: str | None, nested: str | None = None) -> dict:
    """The merged model's config with one dtype key, `dtype` (transformers 5 writes and reads it; transformers 4
    reads `torch_dtype`, and under dtype="auto" without it takes the weights' own dtype): `dtype` at the top;
    in nested configs (a vision-language model's text_config…) `nested` when given (an explicit output dtype),
    else their own value under the one key."""
    cfg = {k: v for k, v in config.items() if k != "torch_dtype"}
    own = config.get("dtype", config.get("torch_dtype"))
    if dtype or own is not None:
        cfg["dtype"] = dtype or own
    for key, sub in cfg.items():
        if isinstance(sub, dict) and ("torch_dtype" in sub or "dtype" in sub):
            cfg[key] = output_config(sub, nested, nested)
    return cfg


# JSON side files that may point at other files (tokenizer_config.json's tokenizer_file, a processor's vocab_file…):
# rewritten on export so that the merged folder never points outside itself.
POINTING_FILES = ("tokenizer_config.json", "special_tokens_map.json", "preprocessor_config.json",
                  "chat_template.json")


def _plain(name: str) -> bool:
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\") and ":" not in name


def drop_outside_pointers(doc: dict, present: set[str]) -> dict:
    """`doc` without the pointers that would lead a loader of the merged folder elsewhere: `*_file` entries that are
    not a plain name of a file written beside it (absolute paths, `../x`, `sub/x`, a file not copied), a
    `name_or_path` that is a local path, and `auto_map` entries naming another repository's code (`org/repo--x.Cls`).
    Everything else is kept as it was."""
    out = {}
    for key, value in doc.items():
        if isinstance(key, str) and key.endswith("_file") and isinstance(value, str):
            if not (_plain(value) and value in present):
                continue
        elif key in ("name_or_path", "_name_or_path") and isinstance(value, str):
            hub_id = value.count("/") == 1 and not value.startswith((".", "/", "~")) and "\\" not in value
            if value and not hub_id:
                continue
        elif key == "auto_map" and isinstance(value, dict):
            local = {k: v for k, v in value.items() if "--" not in json.dumps(v)}
            if not local:
                continue
            value = local
        out[key] = value
    return out


def copy_side_files(base: Checkpoint, folder: Path, out_dtype: str | None,
                    planned: list[FileIdentity] | None = None, *, config: dict | None = None,
                    replace: dict[str, bytes] | None = None) -> list[str]:
    """Write config.json (`config`, else the base's, with the output's dtype) and copy the planned allow-listed
    files (checked again: each must still be the file that was checked), except those `replace` gives new
    contents for (a union tokenizer); pointers out of the folder are dropped (`drop_outside_pointers`). Return
    the names written."""
    written = []
    planned = plan_side_files(base) if planned is None else planned
    replace = replace or {}
    present = {"config.json", *replace, *(ident.path.name for ident in planned)}
    cfg = drop_outside_pointers(dict(base.config or {}) if config is None else dict(config), present)
    if cfg:
        cfg = output_config(cfg, CODE_TO_NAME.get(out_dtype or base_float_dtype(base) or "", None),
                            CODE_TO_NAME.get(out_dtype or "", None))
        (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        written.append("config.json")
    for name, data in replace.items():
        with open(folder / name, "xb") as dst:
            dst.write(_without_outside_pointers(data, present) if name in POINTING_FILES else data)
        written.append(name)
    for ident in planned:
        name = ident.path.name
        if name in replace:
            continue
        try:
            with open_checked(ident) as src, open(folder / name, "xb") as dst:
                data = src.read(MAX_SIDE_FILE + 1) if name in POINTING_FILES else None
                if data is None:
                    shutil.copyfileobj(src, dst, 1 << 20)
                else:
                    dst.write(_without_outside_pointers(data, present))
        except RamStudioError as exc:
            raise RamStudioError(f"not copying {printable(name, 80)} from the base: {exc.message}", exc.hint) from None
        written.append(name)
    return written


def base_float_dtype(base: Checkpoint) -> str | None:
    """The float dtype holding most of the base's parameters (what a merge writes by default)."""
    codes = {e.dtype for e in base.tensors.values() if e.dtype in FLOAT_CODES}
    return max(codes, key=lambda c: sum(e.numel for e in base.tensors.values() if e.dtype == c)) if codes else None


def _without_outside_pointers(data: bytes, present: set[str]) -> bytes:
    """A pointing JSON side file rewritten without its outside pointers; the same bytes when it has none (or is not
    a JSON object: copied as it is, as before)."""
    try:
        doc = loads_json(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return data
    if not isinstance(doc, dict):
        return data
    kept = drop_outside_pointers(doc, present)
    return data if kept == doc else (json.dumps(kept, indent=2, ensure_ascii=False) + "\n").encode()

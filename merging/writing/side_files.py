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

from merging.reading.checkpoint import Checkpoint
from merging.common.dtypes import CODE_TO_NAME, FLOAT_CODES
from merging.common.errors import RamStudioError, printable
from merging.reading.model_folder import FileIdentity, check_file, open_checked
from merging.common.untrusted import loads_json

SIDE_FILE_PATTERNS = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                      "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
                      "*.tiktoken", "chat_template.json", "chat_template.jinja", "preprocessor_config.json")
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
                    planned: list[FileIdentity] | None = None) -> list[str]:
    """Write config.json (dtype set to the output's) and copy the planned allow-listed files (checked again:
    each must still be the file that was checked; pointers out of the folder dropped: `drop_outside_pointers`);
    return their names."""
    written = []
    planned = plan_side_files(base) if planned is None else planned
    present = {"config.json", *(ident.path.name for ident in planned)}
    cfg = drop_outside_pointers(dict(base.config or {}), present)
    if cfg:
        dtype = CODE_TO_NAME.get(out_dtype or base_float_dtype(base) or "", None)
        if dtype:
            cfg["torch_dtype"] = dtype
            if "dtype" in cfg:
                cfg["dtype"] = dtype
        (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        written.append("config.json")
    for ident in planned:
        name = ident.path.name
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

"""The small files copied from the base folder next to the merged weights, and nothing else.

Copied: config.json (rewritten with the output dtype), generation_config.json, tokenizer files and chat
templates, named in an allow-list — what `transformers` and vLLM need to load and prompt the model.
Each must be a regular file inside the base folder (or, for a Hub snapshot, a link into its blob store)
no larger than MAX_SIDE_FILE; links elsewhere, folders and special files are never followed or copied.
"""
from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

from .checkpoint import Checkpoint
from .dtypes import CODE_TO_NAME, FLOAT_CODES
from .errors import RamStudioError, printable
from .model_folder import resolve_file

SIDE_FILE_PATTERNS = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                      "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
                      "*.tiktoken", "chat_template.json", "chat_template.jinja", "preprocessor_config.json")
MAX_SIDE_FILE = 64 << 20


def is_side_file(name: str) -> bool:
    """Whether a file name is on the allow-list (config.json is written separately)."""
    return any(fnmatch.fnmatchcase(name, p) for p in SIDE_FILE_PATTERNS)


def copy_side_files(base: Checkpoint, folder: Path, out_dtype: str | None) -> list[str]:
    """Write config.json (dtype set to the output's) and copy the allow-listed files; return their names."""
    written = []
    cfg = dict(base.config or {})
    if cfg:
        dtype = CODE_TO_NAME.get(out_dtype or base_float_dtype(base) or "", None)
        if dtype:
            cfg["torch_dtype"] = dtype
            if "dtype" in cfg:
                cfg["dtype"] = dtype
        (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        written.append("config.json")
    for src in sorted(base.folder.iterdir(), key=lambda p: p.name):
        if not is_side_file(src.name):
            continue
        try:
            real = resolve_file(base.folder, src.name, max_bytes=MAX_SIDE_FILE)
        except FileNotFoundError:
            continue  # a dangling link
        except RamStudioError as exc:
            raise RamStudioError(f"not copying {printable(src.name, 80)} from the base: {exc.message}", exc.hint) from None
        shutil.copyfile(real, folder / src.name, follow_symlinks=True)
        written.append(src.name)
    return written


def base_float_dtype(base: Checkpoint) -> str | None:
    """The float dtype holding most of the base's parameters (what a merge writes by default)."""
    codes = {e.dtype for e in base.tensors.values() if e.dtype in FLOAT_CODES}
    return max(codes, key=lambda c: sum(e.numel for e in base.tensors.values() if e.dtype == c)) if codes else None

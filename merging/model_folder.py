"""Which files of a model folder may be read, and how: only regular files inside the folder.

A model folder is untrusted input. Every file read from it (weights, index, config, tokenizer, chat
templates) must be named by a plain file name and be a regular file whose real path lies inside the
folder; for a Hugging Face cache snapshot, whose files are symlinks into the repo's blob store, the real
path may instead lie in that blob store. Small files have a size cap. Nothing outside is ever opened.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from .errors import RamStudioError, printable

MAX_SMALL_FILE = 64 << 20  # config, index, tokenizer, chat templates: far below this in practice


def hub_blob_store(folder: Path) -> Path | None:
    """`…/models--org--name/blobs` when `folder` is a snapshot `…/models--org--name/snapshots/REV`."""
    folder = Path(folder)
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith(("models--", "datasets--")):
        return folder.parent.parent / "blobs"
    return None


def is_plain_name(name: object) -> bool:
    """A file name with no folder part: not absolute, no '/', '\\', '..', NUL or control characters."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and name not in (".", "..")
            and not any(c in name for c in "/\\\x00") and printable(name) == name)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def resolve_file(folder: Path, name: str, *, max_bytes: int | None = None) -> Path:
    """`folder / name`, after checking the file against the rules above (raises FileNotFoundError when
    it does not exist, and a clear error when it may not be read)."""
    folder = Path(folder)
    if not is_plain_name(name):
        raise RamStudioError(f"{folder} refers to a file named {printable(name, 80)!r}, which is not a plain "
                             "file name inside the folder.",
                             "Only files inside a model folder are read; fix the index or config that names it.")
    path = folder / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise RamStudioError(f"cannot read {path}: {exc.strerror or exc}.") from None
    real_folder = folder.resolve()
    if stat.S_ISLNK(st.st_mode):
        real = path.resolve()
        store = hub_blob_store(real_folder)
        allowed = _inside(real, real_folder) or (store is not None and _inside(real, store.resolve()))
        if not allowed:
            raise RamStudioError(f"{path} is a link to a file outside the model folder.",
                                 "Only regular files inside a model folder are read: copy the file in, "
                                 "or point at the folder that really holds it.")
        st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        raise RamStudioError(f"{path} is not a regular file.", "Only regular files inside a model folder are read.")
    if max_bytes is not None and st.st_size > max_bytes:
        raise RamStudioError(f"{path} is {st.st_size:,} bytes, more than the {max_bytes:,} a file of its kind "
                             "may have.", "Check that it is the right file.")
    return path


def read_json_object(folder: Path, name: str, what: str) -> dict | None:
    """A small JSON file of the folder as a dict (None when absent); anything else is a clear error."""
    try:
        path = resolve_file(folder, name, max_bytes=MAX_SMALL_FILE)
    except FileNotFoundError:
        return None
    shown = Path(folder) / name
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RamStudioError(f"{shown} is not valid JSON.", f"Fix or re-download the {what}.") from None
    except OSError as exc:
        raise RamStudioError(f"cannot read {shown}: {exc.strerror or exc}.") from None
    if not isinstance(data, dict):
        raise RamStudioError(f"{shown} holds a JSON {type(data).__name__}, not an object.",
                             f"Fix or re-download the {what}.")
    return data

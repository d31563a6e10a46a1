"""Which files of a model folder may be read, and how: the one containment rule for every file read.

A model folder is untrusted input (a download, an extracted archive, a Hugging Face cache entry). Every file
read from it — weights, index, config, tokenizer, chat templates — must:

- be named by a plain file name (no folder part);
- be a regular file whose real path (every link resolved) lies inside the real path of the folder, or, for a
  Hugging Face cache snapshot (`…/models--org--name/snapshots/REV`, whose files are links into the repo's
  blob store), inside that repo's `blobs` folder — which must itself be a real folder of that repo, never a
  link (a `blobs` link to `/` would otherwise make every file of the disk "a blob");
- not be a hard link shared with another path (link count > 1), which could bring in any file of the disk —
  except a blob of the repo's own store whose content matches its name (the sha256 or git blob hash the Hub
  gave it; checked for the small files, which are copied into outputs);
- stay under a size cap when it is a small file.

Nothing outside is ever opened; the rule is checked before any work starts (side files included).
"""
from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from merging.common.errors import RamStudioError, printable
from merging.common.untrusted import TooComplex, loads_json

MAX_SMALL_FILE = 64 << 20  # config, index, tokenizer, chat templates: far below this in practice
_HEX = frozenset("0123456789abcdef")


def hub_blob_store(folder: Path) -> Path | None:
    """`…/models--org--name/blobs` when `folder` (a real path) is a snapshot `…/models--org--name/snapshots/REV`."""
    folder = Path(folder)
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith(("models--", "datasets--")):
        return folder.parent.parent / "blobs"
    return None


def checked_blob_store(real_folder: Path) -> Path | None:
    """The blob store of a snapshot folder (a real path) after checking it is a real folder of that repo;
    None when `real_folder` is not a snapshot; a clear error when the store is a link or not a folder."""
    store = hub_blob_store(real_folder)
    if store is None:
        return None
    try:
        st = os.lstat(store)
    except FileNotFoundError:
        return None  # no blob store: every file must then be a regular file in the snapshot itself
    except OSError as exc:
        raise RamStudioError(f"cannot read {store}: {exc.strerror or exc}.") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise RamStudioError(f"{store} (the blob store of the cached repo holding {real_folder.name}) is "
                             f"{'a link' if stat.S_ISLNK(st.st_mode) else 'not a folder'}.",
                             "A Hugging Face cache keeps its blobs in a real folder of the repo; this cache entry "
                             "is damaged or was made to read files from elsewhere. Download the model again.")
    return store


def refuse_linked_snapshot(folder: Path, real_folder: Path) -> None:
    """A snapshot folder (`…/models--org--name/snapshots/REV`) that is itself a link must resolve inside its own
    cached repo (the Hub client never links snapshot folders; an archive could link one anywhere)."""
    given = Path(os.path.abspath(folder))
    if hub_blob_store(given) is None or not os.path.islink(given):
        return
    repo = given.parent.parent.resolve()
    if not _inside(real_folder, repo):
        raise RamStudioError(f"{given} is a cached snapshot that links to {real_folder}, outside its repo {repo}.",
                             "A Hugging Face cache entry keeps its snapshots inside the repo folder; this one is "
                             "damaged or was made to read files from elsewhere. Download the model again.")


def is_plain_name(name: object) -> bool:
    """A file name with no folder part: not absolute, no '/', '\\', '..', NUL or control characters."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and name not in (".", "..")
            and not any(c in name for c in "/\\\x00") and printable(name) == name)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


@dataclass(frozen=True)
class FileIdentity:
    """What a checked file was when it was checked: device, inode, size and modification time. A file
    opened later must still be the same (see `open_checked`)."""

    path: Path
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path, st: os.stat_result) -> "FileIdentity":
        return cls(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def matches(self, st: os.stat_result) -> bool:
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == (self.dev, self.ino, self.size, self.mtime_ns)


def check_file(folder: Path, name: str, *, max_bytes: int | None = None) -> FileIdentity:
    """Check `folder / name` against the rules above and return what it is (raises FileNotFoundError when it
    does not exist, and a clear error when it may not be read)."""
    folder = Path(folder)
    if not is_plain_name(name):
        raise RamStudioError(f"{folder} refers to a file named {printable(name, 80)!r}, which is not a plain "
                             "file name inside the folder.",
                             "Only files inside a model folder are read; fix the index or config that names it.")
    path = folder / name
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise RamStudioError(f"cannot read {path}: {exc.strerror or exc}.") from None
    real_folder = folder.resolve()
    refuse_linked_snapshot(folder, real_folder)
    store = checked_blob_store(real_folder)
    real = path.resolve() if stat.S_ISLNK(lst.st_mode) else real_folder / name
    in_store = store is not None and _inside(real, store) and real != store
    if not (_inside(real, real_folder) or in_store):
        raise RamStudioError(f"{path} is a link to a file outside the model folder.",
                             "Only regular files inside a model folder are read: copy the file in, "
                             "or point at the folder that really holds it.")
    try:
        st = os.stat(real) if stat.S_ISLNK(lst.st_mode) else lst
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise RamStudioError(f"cannot read {path}: {exc.strerror or exc}.") from None
    if not stat.S_ISREG(st.st_mode):
        raise RamStudioError(f"{path} is not a regular file.", "Only regular files inside a model folder are read.")
    if max_bytes is not None and st.st_size > max_bytes:
        raise RamStudioError(f"{path} is {st.st_size:,} bytes, more than the {max_bytes:,} a file of its kind "
                             "may have.", "Check that it is the right file.")
    if st.st_nlink > 1 and not (in_store and (max_bytes is None or _blob_matches_name(real, st.st_size))):
        raise RamStudioError(f"{path} is a hard link shared with {st.st_nlink - 1} other path(s): a hard link can "
                             "bring any file of the disk into a model folder, so it is not read.",
                             "Copy the file into the folder (cp without -l), or download the model again.")
    return FileIdentity.of(path, st)


def resolve_file(folder: Path, name: str, *, max_bytes: int | None = None) -> Path:
    """`folder / name`, after `check_file`."""
    return check_file(folder, name, max_bytes=max_bytes).path


def open_checked(ident: FileIdentity):
    """Open a checked file for reading and make sure it is still the file that was checked (a link swapped
    or a file replaced since is refused, never read)."""
    # O_NONBLOCK: a FIFO put in the file's place must not block the open (regular files ignore the flag).
    fd = os.open(ident.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not ident.matches(os.fstat(fd)):
            raise RamStudioError(f"{ident.path} changed after it was checked.",
                                 "Something is modifying the model folder; run again once it is settled.")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _blob_matches_name(real: Path, size: int) -> bool:
    """Whether a cached blob's content hashes to its name: sha256 (LFS files) or git's blob sha1 (others)."""
    name = real.name
    if len(name) == 64 and set(name) <= _HEX:
        h = hashlib.sha256()
    elif len(name) == 40 and set(name) <= _HEX:
        h = hashlib.sha1()
        h.update(f"blob {size}\0".encode())
    else:
        return False
    with open(real, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest() == name


def read_json_object(folder: Path, name: str, what: str) -> dict | None:
    """A small JSON file of the folder as a dict (None when absent); anything else is a clear error."""
    try:
        ident = check_file(folder, name, max_bytes=MAX_SMALL_FILE)
    except FileNotFoundError:
        return None
    shown = Path(folder) / name
    try:
        with open_checked(ident) as f:
            data = loads_json(f.read(MAX_SMALL_FILE + 1).decode("utf-8"))
    except TooComplex as exc:
        raise RamStudioError(f"{shown} {exc.reason}.", f"Fix or re-download the {what}.") from None
    except (UnicodeDecodeError, ValueError):
        raise RamStudioError(f"{shown} is not valid JSON.", f"Fix or re-download the {what}.") from None
    except OSError as exc:
        raise RamStudioError(f"cannot read {shown}: {exc.strerror or exc}.") from None
    if not isinstance(data, dict):
        raise RamStudioError(f"{shown} holds a JSON {type(data).__name__}, not an object.",
                             f"Fix or re-download the {what}.")
    return data

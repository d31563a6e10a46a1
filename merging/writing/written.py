"""What a merge wrote, recorded when it committed the folder, and reading it back only while it is exactly that.

The app's zip download, its card and recipe downloads and a Hub upload happen later, at a click: by then the
output path may name something else (the folder swapped for a link to another folder, a file replaced). So
they never re-read the path: they open the folder the merge created (same device and inode, not through a
link) and each file in it by name (same device, inode and size, not a link), and for outputs small enough to
hash at commit, check each file's SHA-256 as it is read.
"""
from __future__ import annotations

import hashlib
import io
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from merging.common.errors import RamStudioError

HASH_LIMIT = 512 << 20  # outputs up to this size are hashed at commit (the app zips only smaller ones)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class WrittenFile:
    """One file of a committed output folder: its name, size, identity and (small outputs) SHA-256."""

    name: str
    size: int
    dev: int
    ino: int
    sha256: str | None


@dataclass(frozen=True)
class WrittenFolder:
    """A committed output folder: where it is, its identity, and every file in it."""

    path: Path
    dev: int
    ino: int
    files: tuple[WrittenFile, ...]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, name: str) -> WrittenFile | None:
        return next((f for f in self.files if f.name == name), None)


def record(folder: Path, final: Path, skip: frozenset[str] = frozenset()) -> WrittenFolder:
    """Record the finished temporary `folder` (to be renamed to `final`: the rename keeps every identity),
    leaving out the names in `skip` (removed before the rename)."""
    st = os.stat(folder)
    entries = sorted((e for e in os.scandir(folder) if e.name not in skip), key=lambda e: e.name)
    total = sum(e.stat(follow_symlinks=False).st_size for e in entries)
    files = []
    for e in entries:
        fst = e.stat(follow_symlinks=False)
        if not stat.S_ISREG(fst.st_mode):
            continue
        digest = _sha256(Path(e.path)) if total <= HASH_LIMIT else None
        files.append(WrittenFile(e.name, fst.st_size, fst.st_dev, fst.st_ino, digest))
    return WrittenFolder(Path(final), st.st_dev, st.st_ino, tuple(files))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _changed(what: str) -> RamStudioError:
    return RamStudioError(f"{what} is no longer what the merge wrote.",
                          "Something changed the output folder after the merge; run the merge again.")


def _open_folder(wf: WrittenFolder) -> int:
    try:
        fd = os.open(wf.path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | _CLOEXEC)
    except OSError:
        raise _changed(f"the output folder {wf.path}") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (wf.dev, wf.ino):
        os.close(fd)
        raise _changed(f"the output folder {wf.path}")
    return fd


def open_file(wf: WrittenFolder, f: WrittenFile) -> BinaryIO:
    """Open one written file, refusing it unless it is still the file the merge wrote (same folder, same
    device, inode and size; never through a link)."""
    dir_fd = _open_folder(wf)
    try:
        fd = os.open(f.name, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=dir_fd)
    except OSError:
        raise _changed(f"{wf.path / f.name}") from None
    finally:
        os.close(dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino, st.st_size) != (f.dev, f.ino, f.size):
        os.close(fd)
        raise _changed(f"{wf.path / f.name}")
    return os.fdopen(fd, "rb")


def read_blocks(wf: WrittenFolder, f: WrittenFile) -> Iterator[bytes]:
    """The bytes of one written file in blocks; the last block is yielded only once its hash (when one was
    recorded) and size are checked, so a caller that consumes everything never gets altered content."""
    h = hashlib.sha256() if f.sha256 else None
    size = 0
    with open_file(wf, f) as fh:
        pending = fh.read(1 << 20)
        while pending:
            nxt = fh.read(1 << 20)
            size += len(pending)
            if h is not None:
                h.update(pending)
            if not nxt and (size != f.size or (h is not None and h.hexdigest() != f.sha256)):
                raise _changed(f"{wf.path / f.name}")
            yield pending
            pending = nxt


def read_bytes(wf: WrittenFolder, name: str) -> bytes:
    """A small written file's content, verified (see `read_blocks`)."""
    f = wf.file(name)
    if f is None:
        raise RamStudioError(f"the merge wrote no {name}.")
    return b"".join(read_blocks(wf, f))


def zip_bytes(wf: WrittenFolder) -> bytes:
    """A zip of exactly the files the merge wrote (`FOLDER/NAME` entries), each verified as it is read."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in wf.files:
            with zf.open(f"{wf.path.name}/{f.name}", "w", force_zip64=f.size > (1 << 31)) as out:
                for block in read_blocks(wf, f):
                    out.write(block)
    return buf.getvalue()

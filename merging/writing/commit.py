"""How a checked output folder appears: one writer per target, a hidden temporary sibling, the rename into place.

- One writer per target: an exclusive lock (`.NAME.lock` beside it) is held from the start of a merge
  to the final rename, and a second writer fails fast naming the first.
- Work happens in a hidden sibling `.NAME.partial-…` holding our marker file; a leftover of a killed merge is
  removed only when it is provably ours: our marker, naming this target, written on this host by a process
  that is gone — and it is not an input and holds none.
- The finished temporary folder is renamed into place without replacing anything that appeared
  meanwhile (renameat2 RENAME_NOREPLACE); an old folder being overwritten is moved aside only after
  checking it is still the one that was checked at the start (merging/writing/placement.py checked it).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import glob
import json
import os
import re
import shutil
import socket
import stat
import time
import uuid
from pathlib import Path
from typing import Iterable

from merging.common.errors import RamStudioError
from merging.common.untrusted import loads_json
from merging.writing.placement import PARTIAL_MARK, FolderTarget, Protected, refuse_inside_inputs, written_by_us

PARTIAL_MARKER = ".ram-studio-partial"  # written first into every temporary folder: what proves it ours


# ---------------------------------------------------------------- one writer per target

class TargetLock:
    """Exclusive lock on one output path, held by an open file (released by the kernel if we die)."""

    def __init__(self, target: Path, what: str) -> None:
        self.target = target
        self.path = target.parent / f".{target.name}.lock"
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> "TargetLock":
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RamStudioError(f"another merge is writing {self.target} right now "
                                     f"({holder}).",
                                     "Wait for it to finish, or choose another output folder.") from None
            try:  # the holder before us may have removed the file after we opened it: lock the current one
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "what": self.what}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "TargetLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = loads_json(os.read(fd, 4096).decode() or "{}")
        if not isinstance(info, dict):
            raise ValueError("not an object")
        return (f"pid {int(info.get('pid', 0))} on {str(info.get('host', '?'))[:64]}, started "
                f"{str(info.get('started', '?'))[:32]}: {str(info.get('what', ''))[:200]}")
    except (OSError, ValueError, TypeError):
        return "a RAM Studio merge"


# ---------------------------------------------------------------- temp folder and the final rename

def create_parents(target: FolderTarget) -> None:
    """Create the output's missing parent folders, remembered so that a failed merge removes them."""
    missing = []
    p = target.path.parent
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir()
        target.created_parents.append(d)


def make_temp_folder(target: FolderTarget) -> Path:
    """A hidden temporary sibling of the target holding our marker file (stale ones of dead merges into the
    same target are removed first, when provably ours)."""
    remove_stale_partials(target.path, target.inputs)
    tmp = target.path.parent / f".{target.path.name}{PARTIAL_MARK}{uuid.uuid4().hex[:8]}-{os.getpid()}"
    tmp.mkdir(mode=0o755)
    marker = {"pid": os.getpid(), "host": socket.gethostname(), "target": target.path.name,
              "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    with open(tmp / PARTIAL_MARKER, "x") as f:
        f.write(json.dumps(marker))
    st = os.lstat(tmp)
    target.temp = (st.st_dev, st.st_ino)
    return tmp


def discard(tmp: Path | None, target: FolderTarget) -> None:
    """After a failure: remove the temp folder (only while its path still reaches the folder this merge made) and
    the parent folders this merge created (if empty)."""
    if tmp is not None:
        try:
            st = os.lstat(tmp)
            ours = target.temp is None or ((st.st_dev, st.st_ino) == target.temp and stat.S_ISDIR(st.st_mode))
        except OSError:
            ours = False
        if ours:
            shutil.rmtree(tmp, ignore_errors=True)
    for d in reversed(target.created_parents):
        try:
            d.rmdir()
        except OSError:
            break


def remove_stale_partials(out: Path, inputs: list[Protected] = ()) -> list[Path]:
    """Remove temporary folders left by killed merges into the same target; returns what was removed.

    Only what is provably our own leftover goes: a real folder (not a link) named `.NAME.partial-XXXXXXXX-PID`,
    holding our marker file that names this target, this host and that PID, whose process is gone — and
    that is not an input and holds no input (compared by device and inode)."""
    pattern = re.compile(re.escape(f".{out.name}{PARTIAL_MARK}") + r"[0-9a-f]{8}-(\d+)")
    host = socket.gethostname()
    removed = []
    for p in out.parent.glob(f".{glob.escape(out.name)}{PARTIAL_MARK}*"):
        m = pattern.fullmatch(p.name)
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        if not _is_our_partial(p, out.name, host, int(m.group(1)), inputs):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def _is_our_partial(folder: Path, target: str, host: str, pid: int, inputs: Iterable[Protected]) -> bool:
    try:
        st = os.lstat(folder)
        mst = os.lstat(folder / PARTIAL_MARKER)
        if not stat.S_ISDIR(st.st_mode) or not stat.S_ISREG(mst.st_mode) or mst.st_size > 4096:
            return False
        marker = loads_json((folder / PARTIAL_MARKER).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    if not (isinstance(marker, dict) and marker.get("target") == target and marker.get("host") == host
            and marker.get("pid") == pid):
        return False
    own = (st.st_dev, st.st_ino)
    return not any(own == p.ident or own in p.above for p in inputs)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recheck_placement(tmp: Path, target: FolderTarget) -> None:
    """At the end of a merge, the placement rules again: the temporary folder is still the one made at the start,
    reached through the same parent (not a parent swapped for a link meanwhile), and the target is still outside
    every input."""
    try:
        st = os.stat(tmp)
        same = target.temp is None or ((st.st_dev, st.st_ino) == target.temp and stat.S_ISDIR(st.st_mode))
    except OSError:
        same = False
    if not same:
        raise RamStudioError(f"the folder of {target.path} changed while this merge ran (moved, replaced or made a "
                             "link); the merged model was not put there.", "Run the merge again into a folder nobody "
                             "else changes.")
    refuse_inside_inputs(target.path, target.inputs, "output folder")


def commit(tmp: Path, target: FolderTarget) -> None:
    """Move the finished temp folder into place without replacing anything that appeared meanwhile (its placement
    checked again first)."""
    recheck_placement(tmp, target)
    out = target.path
    (tmp / PARTIAL_MARKER).unlink(missing_ok=True)  # the finished folder holds only what a merge writes
    if out.exists() or out.is_symlink():
        st = os.lstat(out)
        if target.replaces != (st.st_dev, st.st_ino) or not stat.S_ISDIR(st.st_mode):
            raise RamStudioError(f"{out} appeared while this merge was running; it was not replaced.",
                                 "Choose another output folder and run the merge again.")
        if not any(out.iterdir()):
            out.rmdir()
        else:
            why = written_by_us(out, target.side_file_ok)  # still only what a merge writes, checked again now
            if why:
                raise RamStudioError(f"refusing to overwrite {out}: {why} (it changed while this merge ran).",
                                     "Choose another output folder and run the merge again.")
            aside = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(out, aside)
            try:
                rename_no_replace(tmp, out)
            except BaseException:
                os.rename(aside, out)
                raise
            shutil.rmtree(aside, ignore_errors=True)
            return
    rename_no_replace(tmp, out)


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def rename_no_replace(src: Path, dst: Path) -> None:
    """rename(2) that fails if `dst` exists (renameat2 with RENAME_NOREPLACE; a checked rename where the
    kernel or filesystem lacks it)."""
    fn = getattr(_libc(), "renameat2", None)
    if fn is not None:
        if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise RamStudioError(f"{dst} appeared while this merge was running; it was not replaced.",
                                 "Choose another output folder and run the merge again.")
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(dst))
    if dst.exists() or dst.is_symlink():
        raise RamStudioError(f"{dst} appeared while this merge was running; it was not replaced.",
                             "Choose another output folder and run the merge again.")
    os.rename(src, dst)


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC

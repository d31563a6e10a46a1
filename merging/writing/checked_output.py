"""Outputs checked twice — when a command starts and again when it writes — and written through a directory handle.

A report (`analyze/sweep/evaluate --json`, `--csv`) may be written minutes after its path was checked, and a cache
or score store is written all along a run. Between the check and the write, someone may put a file at the path, or
swap the output's folder for a link into an input model. So:

- At check time the output's folder is opened (`O_DIRECTORY`) and kept open; the placement rules of
  merging/writing/placement.py are applied to where that handle really is.
- At write time the rules are applied again (the folder must still be the one opened, reached by the same path,
  and not inside, over or around an input), and the data goes through the handle: a temporary file created in
  that folder (`O_EXCL | O_NOFOLLOW`), then renamed into place by name inside it.
- A file that was not at the path when it was checked is never replaced (renameat2 RENAME_NOREPLACE, or a hard
  link then unlink where the kernel lacks it); with --overwrite, a file that was there is replaced only while it
  is still that file (an atomic exchange, undone if what came out is not the checked file).

The small race left (the folder itself moved into an input between the second check and the rename, a few
microseconds) is the one every POSIX tool without openat2's RESOLVE_BENEATH has.
"""
from __future__ import annotations

import ctypes
import errno
import os
import stat
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

from merging.common.errors import RamStudioError, printable
from merging.writing.placement import PARTIAL_MARK, Identity, Protected, refuse_inside_inputs

_O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_O_TMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_LIBC: list = []


def _renameat2(dir_fd: int, src: str, dst: str, flags: int) -> int | None:
    """renameat2(2) inside one folder; 0, an errno, or None where libc has no renameat2."""
    if not _LIBC:
        try:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        except OSError:
            _LIBC.append(None)
    fn = getattr(_LIBC[0], "renameat2", None) if _LIBC[0] is not None else None
    if fn is None:
        return None
    if fn(dir_fd, os.fsencode(src), dir_fd, os.fsencode(dst), flags) == 0:
        return 0
    return ctypes.get_errno()


def _real(path: Path) -> Path:
    """Absolute, every existing link resolved (the part that does not exist yet kept)."""
    return Path(os.path.abspath(os.path.expanduser(path))).resolve()


def _ident(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino


class FileVersion(NamedTuple):
    """An existing output file as checked: its identity, and its change time and size — a file removed and written
    again at once by someone else can get the same inode number back, but not the same change time and size."""
    ident: Identity
    ctime_ns: int
    size: int


def _version(st: os.stat_result) -> FileVersion:
    return FileVersion(_ident(st), st.st_ctime_ns, st.st_size)


def _where(fd: int, fallback: Path) -> Path:
    """Where an open folder really is now (/proc's view of the handle), else the path resolved."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return _real(fallback)


def _changed(path: Path, what: str) -> RamStudioError:
    return RamStudioError(f"the {what} {path} changed while this command ran (it was moved, replaced "
                          "or made a link since it was checked); nothing was written there.",
                          "Run the command again with an output folder nobody else changes.")


def _appeared(path: Path, what: str) -> RamStudioError:
    return RamStudioError(f"{path} appeared while this command ran; the {what} did not replace it.",
                          "Choose another name (or remove that file yourself) and run the command again.")


def _open_checked_dir(folder: Path, inputs: list[Protected], what: str, name: str = "") -> tuple[int, Identity]:
    """Open `folder` and apply the placement rules to where the handle really is (to `name` in it: a file output's
    folder may hold inputs beside it, the file may not be one or sit inside one)."""
    fd = os.open(folder, _O_DIR)
    try:
        ident = _ident(os.fstat(fd))
        refuse_inside_inputs(_where(fd, folder) / name, inputs, what)
        return fd, ident
    except BaseException:
        os.close(fd)
        raise


def _recheck_dir(fd: int, ident: Identity, folder: Path, inputs: list[Protected], what: str, shown: Path,
                 name: str = "") -> None:
    """At write time: the handle is still the folder reached by its path, and that place is no input's."""
    try:
        now = _ident(os.stat(folder))
    except OSError:
        now = None
    if _ident(os.fstat(fd)) != ident or now != ident:
        raise _changed(shown, f"folder of the {what}" if name else what)
    refuse_inside_inputs(_where(fd, folder) / name, inputs, what)


def _write_temp(fd: int, name: str, data: bytes | list, tmp: str | None = None) -> str:
    """`data` (bytes, or a list of bytes-like pieces written one after the other) in a new hidden file beside `name`
    (named `tmp`, else by our pattern), flushed to disk; its name."""
    tmp = tmp or f".{name}{PARTIAL_MARK}{uuid.uuid4().hex[:8]}-{os.getpid()}"
    out = os.open(tmp, _O_TMP, 0o644, dir_fd=fd)
    try:
        for piece in data if isinstance(data, list) else [data]:
            view = memoryview(piece).cast("B")
            while view:
                view = view[os.write(out, view):]
        os.fsync(out)
    except BaseException:
        os.close(out)
        _unlink(fd, tmp)
        raise
    os.close(out)
    return tmp


def _unlink(fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass


def _rename_no_replace(fd: int, tmp: str, name: str) -> bool:
    """Move `tmp` to `name` unless something is there (False then)."""
    err = _renameat2(fd, tmp, name, _RENAME_NOREPLACE)
    if err == 0:
        return True
    if err == errno.EEXIST:
        return False
    if err not in (None, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        raise OSError(err, os.strerror(err), name)
    try:  # a hard link fails when the name exists: the same guarantee without renameat2
        os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
    except FileExistsError:
        return False
    _unlink(fd, tmp)
    return True


def _replace_same(fd: int, tmp: str, name: str, expected: FileVersion) -> bool:
    """Replace `name` by `tmp` only while `name` is the file `expected` (False when it is something else)."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:  # it was removed meanwhile: nothing to replace
        return _rename_no_replace(fd, tmp, name)
    if _version(st) != expected or not stat.S_ISREG(st.st_mode):
        return False
    err = _renameat2(fd, tmp, name, _RENAME_EXCHANGE)
    if err == errno.ENOENT:
        return _rename_no_replace(fd, tmp, name)
    if err == 0:  # what came out of the exchange must be that file still (a rename changes its ctime, not these)
        st = os.stat(tmp, dir_fd=fd, follow_symlinks=False)
        if _ident(st) == expected.ident and st.st_size == expected.size and stat.S_ISREG(st.st_mode):
            _unlink(fd, tmp)
            return True
        if _renameat2(fd, tmp, name, _RENAME_EXCHANGE) != 0:  # not the checked file: put it back
            raise OSError(errno.EIO, f"could not restore {name} after a refused replace")
        return False
    os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)  # no exchange on this file system: checked just above
    return True


@dataclass
class FileTarget:
    """A checked output file: its path, the inputs it was checked against, its folder held open since the check,
    and the file that was at the path then (None: nothing, so nothing may be replaced)."""

    path: Path
    inputs: list[Protected]
    overwrite: bool
    dir_fd: int = -1
    dir_ident: Identity | None = None
    existed: FileVersion | None = None
    what: str = "output file"
    written: bool = field(default=False, repr=False)

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    def __del__(self) -> None:
        self.close()


def check_output_file(out: str | Path, inputs: list[Protected], *, overwrite: bool) -> FileTarget:
    """Apply the placement rules to a file output (analysis JSON/CSV, sweep and evaluate reports) and hold its
    folder open for `write_file_atomically`."""
    path = Path(os.path.abspath(os.path.expanduser(out)))
    real = _real(path)
    refuse_inside_inputs(real, inputs, "output file")
    if path.is_symlink() or (real.exists() and not real.is_file()):
        raise RamStudioError(f"the output path {path} is not a regular file.", "Choose a file path.")
    if not real.parent.is_dir():
        raise RamStudioError(f"the folder {real.parent} of the output file does not exist.", "Create it first.")
    fd, ident = _open_checked_dir(real.parent, inputs, "output file", path.name)
    target = FileTarget(path, list(inputs), overwrite, fd, ident)
    try:
        st = os.stat(path.name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return target
    if not stat.S_ISREG(st.st_mode):
        target.close()
        raise RamStudioError(f"the output path {path} is not a regular file.", "Choose a file path.")
    if not overwrite:
        target.close()
        raise RamStudioError(f"output file {path} exists.", "Choose another name, or pass --overwrite to replace it.")
    target.existed = _version(st)
    return target


def write_file_atomically(target: FileTarget, data: bytes) -> None:
    """Write a small output file: placement checked again, a temporary file in the folder opened at check time,
    then a rename that never replaces a file other than the one that was there at check time."""
    if target.dir_fd < 0 or target.written:
        raise RamStudioError(f"{target.path} was already written (or its check was closed).",
                             "Check the output path again before writing it.")
    path, fd, name = target.path, target.dir_fd, target.path.name
    try:
        _recheck_dir(fd, target.dir_ident, path.parent, target.inputs, target.what, path, name)
        tmp = _write_temp(fd, name, data)
        try:
            placed = (_rename_no_replace(fd, tmp, name) if target.existed is None
                      else _replace_same(fd, tmp, name, target.existed))
        finally:
            _unlink(fd, tmp)
        if not placed:
            raise _appeared(path, target.what) if target.existed is None else RamStudioError(
                f"{path} was replaced by another file while this command ran; it was not overwritten.",
                "Choose another name and run the command again.")
        os.fsync(fd)
        target.written = True
    finally:
        target.close()


class CheckedFolder:
    """A folder written all along a run (the analysis cache, the sweep's score store): the placement rules when it
    is opened (never is, contains or lies inside an input), again before every write, and every file read or
    written by name through the handle opened then. `hint` says how to move the folder (its setting)."""

    def __init__(self, folder: Path | str, inputs: list[Protected], what: str, hint: str = "", *,
                 create: bool = True) -> None:
        self.path = Path(os.path.abspath(os.path.expanduser(folder)))
        self.inputs, self.what, self.hint = list(inputs), what, hint
        self.fd = -1
        try:
            refuse_inside_inputs(_real(self.path), self.inputs, what)  # before a folder is created anywhere
            if create:
                self.path.mkdir(parents=True, exist_ok=True)
            if self.path.is_symlink() and not self.path.is_dir():
                raise RamStudioError(f"the {what} {self.path} is a dangling link.", hint)
            self.fd, self.ident = _open_checked_dir(self.path, self.inputs, what)
        except RamStudioError as exc:
            raise RamStudioError(exc.message, hint or exc.hint) from None
        except OSError as exc:
            raise RamStudioError(f"cannot use {printable(self.path)} as the {what}: {exc.strerror or exc}.",
                                 hint) from None

    def recheck(self) -> None:
        """The placement rules again (a RamStudioError when the folder moved or now sits in an input)."""
        try:
            _recheck_dir(self.fd, self.ident, self.path, self.inputs, self.what, self.path)
        except RamStudioError as exc:
            raise RamStudioError(exc.message, self.hint or exc.hint) from None

    def write(self, name: str, data: bytes | list, tmp: str | None = None) -> None:
        """Write (or replace) the entry `name` atomically (`data`: bytes, or a list of pieces), after checking the
        folder again (`tmp`: the temporary file's name, when the folder's owner names its own to recognise
        leftovers)."""
        self.recheck()
        tmp = _write_temp(self.fd, name, data, tmp)
        try:
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        finally:
            _unlink(self.fd, tmp)

    def create(self, tmp: str) -> BinaryIO:
        """A new temporary file `tmp` in the folder, for an entry written piece by piece (created through the handle,
        never following a link, never an existing file); publish it with `publish`."""
        self.recheck()
        return os.fdopen(os.open(tmp, _O_TMP, 0o644, dir_fd=self.fd), "wb")

    def publish(self, tmp: str, name: str) -> bool:
        """Move the temporary file `tmp` to `name` after checking the folder again, never replacing an entry another
        writer published first (False then: theirs stays); `tmp` is gone afterwards either way."""
        try:
            self.recheck()
            return _rename_no_replace(self.fd, tmp, name)
        finally:
            _unlink(self.fd, tmp)

    def read(self, name: str, max_bytes: int) -> bytes | None:
        """The entry `name` (None when absent); ValueError when it is not a regular file of at most `max_bytes`
        (a link is not followed, a FIFO never blocks)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                         dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ValueError(f"cannot be opened ({exc.strerror or exc})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("is not a regular file")
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(max_bytes + 1)
            if len(data) > max_bytes:
                raise ValueError(f"is larger than {max_bytes:,} bytes")
            return data
        finally:
            os.close(fd)

    def names(self) -> list[str]:
        """The entries of the folder (through the handle)."""
        return os.listdir(self.fd)

    def unlink(self, name: str) -> None:
        """Remove the entry `name` (a regular file only)."""
        st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            os.unlink(name, dir_fd=self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()

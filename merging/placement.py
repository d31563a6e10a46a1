"""Where outputs may go, and how they appear: the rules that keep a merge from destroying its inputs.

- An output (a model folder, or an analysis file) may not be, contain, or lie inside any input, after
  resolving symlinks; for a Hugging Face cache snapshot the input is the whole cached repo.
- A folder output may not be a file or a symlink. An existing non-empty folder is replaced only with
  `overwrite`, and only when this tool wrote it (it holds our recipe and only files we write).
- One writer per target: an exclusive lock (`.NAME.lock` beside it) is held from the start of a merge
  to the final rename, and a second writer fails fast naming the first.
- The finished temporary folder is renamed into place without replacing anything that appeared
  meanwhile (renameat2 RENAME_NOREPLACE); an old folder being overwritten is moved aside only after
  checking it is still the one that was checked at the start.
CLI and app both call `check_output_folder` / `check_output_file` (the app before it starts a job).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .errors import RamStudioError
from .model_folder import hub_blob_store
from .recipe import RECIPE_NAME

PARTIAL_MARK = ".partial-"
# Files a merge writes (besides copied side files, whose names the side-file allow-list gives).
WRITTEN_NAMES = ("config.json", "README.md", RECIPE_NAME, "mergekit.yaml", "model.safetensors",
                 "model.safetensors.index.json")


@dataclass(frozen=True)
class Protected:
    """A path no output may touch, and the input it belongs to (for the message)."""

    path: Path
    input: str


def protected_paths(folders: Iterable[tuple[str, Path]]) -> list[Protected]:
    """Real paths of every input folder (the whole cached repo for a Hub snapshot) and of the files
    their symlinks point to."""
    out: list[Protected] = []
    for label, folder in folders:
        real = Path(folder).resolve()
        store = hub_blob_store(real)
        out.append(Protected(store.parent if store is not None else real, label))
        try:
            entries = list(Path(folder).iterdir())
        except OSError:
            entries = []
        for p in entries:
            if p.is_symlink():
                out.append(Protected(p.resolve(), label))
    return out


def input_folders(refs: Iterable[str]) -> list[Protected]:
    """Protected paths for model references before anything is downloaded or opened: the folder of a
    local or demo model, the cached repo folder of a Hub model (where its snapshot will be)."""
    from .refs import parse_ref

    pairs = []
    for ref in refs:
        try:
            r = parse_ref(ref)
        except RamStudioError:
            continue  # the merge itself reports a bad reference
        if r.kind == "hub":
            from huggingface_hub import constants

            pairs.append((ref, Path(constants.HF_HUB_CACHE) / f"models--{r.repo_id.replace('/', '--')}"))
        elif r.path is not None:
            pairs.append((ref, r.path))
    return protected_paths(pairs)


def _real(path: Path) -> Path:
    """Absolute path with every existing symlink resolved (the part that does not exist yet is kept)."""
    return Path(os.path.abspath(os.path.expanduser(path))).resolve()


def _clash(real: Path, inputs: list[Protected], what: str) -> None:
    for p in inputs:
        if real == p.path:
            relation = "is"
        elif p.path in real.parents:
            relation = "is inside"
        elif real in p.path.parents:
            relation = "contains"
        else:
            continue
        raise RamStudioError(f"the {what} {real} {relation} the input {p.input} ({p.path}).",
                             "Write outputs outside every input folder: an output must never replace, "
                             "contain or sit inside a model it reads.")


def written_by_us(folder: Path, side_file_ok) -> str | None:
    """Why `folder` is not a folder this tool wrote (None when it is): it must hold our recipe and only
    regular files a merge writes."""
    recipe = folder / RECIPE_NAME
    try:
        doc = json.loads(recipe.read_text()) if recipe.is_file() and not recipe.is_symlink() else None
    except (OSError, ValueError):
        doc = None
    if not (isinstance(doc, dict) and "spec" in doc and "format" in doc):
        return f"it holds no {RECIPE_NAME} written by RAM Studio"
    for p in folder.iterdir():
        st = os.lstat(p)
        if not stat.S_ISREG(st.st_mode):
            return f"it holds {p.name}, which is not a regular file"
        name = p.name
        ours = name in WRITTEN_NAMES or (name.startswith("model-") and name.endswith(".safetensors")) \
            or side_file_ok(name)
        if not ours:
            return f"it holds {name}, which a merge does not write"
    return None


def is_model_folder(folder: Path) -> bool:
    """A folder that holds a model: config.json next to safetensors weights, or a RAM Studio recipe."""
    try:
        if (folder / RECIPE_NAME).is_file():
            return True
        return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))
    except OSError:
        return False


def enclosing_model_folder(real: Path) -> Path | None:
    """The nearest existing ancestor of `real` that is a model folder (an output must never go inside one)."""
    for ancestor in real.parents:
        if ancestor.exists() and is_model_folder(ancestor):
            return ancestor
    return None


def suggest_output_name(base_label: str, spec_fields: dict) -> str:
    """A folder name for a merge: `<base label>-<method>-<8 hex digits of the settings>`.

    Different settings never share a default folder, the same settings always get the same one; the label
    keeps only letters, digits, '.', '_' and '-' (a path's separators never leak into the name)."""
    import hashlib
    import re

    label = re.sub(r"[^A-Za-z0-9._-]+", "_", base_label).strip("._-")[:40] or "model"
    digest = hashlib.sha256(json.dumps(spec_fields, sort_keys=True, default=str).encode()).hexdigest()[:8]
    method = re.sub(r"[^A-Za-z0-9_]+", "_", str(spec_fields.get("method", "merge")))
    return f"{label}-{method}-{digest}"


@dataclass
class FolderTarget:
    """A checked output folder: where it goes, and the folder it may replace (its identity at check time)."""

    path: Path
    replaces: tuple[int, int] | None = None  # (st_dev, st_ino) of an existing folder we may replace
    created_parents: list[Path] = field(default_factory=list)


def check_output_folder(out: str | Path, inputs: list[Protected], *, overwrite: bool,
                        side_file_ok=lambda name: False) -> FolderTarget:
    """Apply the placement rules to a model output folder; raise a clear error saying why not."""
    if not str(out).strip():
        raise RamStudioError("no output folder given.", "Pass --out DIR.")
    path = Path(os.path.abspath(os.path.expanduser(out)))
    if path.is_symlink():
        raise RamStudioError(f"the output path {path} is a symbolic link.", "Give the real folder to write.")
    real = _real(path)
    _clash(real, inputs, "output folder")
    if real.exists() and not real.is_dir():
        raise RamStudioError(f"the output path {path} is a file.", "Choose a folder path.")
    holder = enclosing_model_folder(real)
    if holder is not None:
        raise RamStudioError(f"the output folder {path} would sit inside the model folder {holder}.",
                             "Write each merged model into its own folder beside other models, never inside "
                             "one (for example merged-models/NAME).")
    ancestor = real.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise RamStudioError(f"{ancestor} is a file, so the output folder {path} cannot be created.",
                             "Choose another output folder.")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise RamStudioError(f"cannot write in {ancestor} (permission denied).", "Choose another output folder.")
    if not real.exists() or not any(real.iterdir()):
        st = real.stat() if real.exists() else None
        return FolderTarget(path, (st.st_dev, st.st_ino) if st else None)
    if not overwrite:
        raise RamStudioError(f"output folder {path} exists and is not empty.",
                             "Choose another folder, or allow overwriting (CLI: --overwrite; app: the "
                             "'Overwrite' box) to replace a folder RAM Studio wrote.")
    why = written_by_us(real, side_file_ok)
    if why:
        raise RamStudioError(f"refusing to overwrite {path}: {why}.",
                             "Only an empty folder or a merged model written by RAM Studio is replaced; "
                             "choose another output folder.")
    st = real.stat()
    return FolderTarget(path, (st.st_dev, st.st_ino))


def check_output_file(out: str | Path, inputs: list[Protected], *, overwrite: bool) -> Path:
    """Apply the placement rules to a file output (analysis JSON/CSV, inspect JSON)."""
    path = Path(os.path.abspath(os.path.expanduser(out)))
    real = _real(path)
    _clash(real, inputs, "output file")
    if path.is_symlink() or (real.exists() and not real.is_file()):
        raise RamStudioError(f"the output path {path} is not a regular file.", "Choose a file path.")
    if not real.parent.is_dir():
        raise RamStudioError(f"the folder {real.parent} of the output file does not exist.", "Create it first.")
    if real.exists() and not overwrite:
        raise RamStudioError(f"output file {path} exists.", "Choose another name, or pass --overwrite to replace it.")
    return path


def write_file_atomically(path: Path, data: bytes) -> None:
    """Write a small output file through a temporary sibling and a rename."""
    tmp = path.with_name(f".{path.name}{PARTIAL_MARK}{uuid.uuid4().hex[:8]}-{os.getpid()}")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
                                     f"({holder}).", "Wait for it to finish, or choose another output folder.") from None
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
        info = json.loads(os.read(fd, 4096).decode() or "{}")
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
    """A hidden temporary sibling of the target (stale ones of dead merges are removed first)."""
    remove_stale_partials(target.path)
    tmp = target.path.parent / f".{target.path.name}{PARTIAL_MARK}{uuid.uuid4().hex[:8]}-{os.getpid()}"
    tmp.mkdir()
    return tmp


def discard(tmp: Path | None, target: FolderTarget) -> None:
    """After a failure: remove the temp folder and the parent folders this merge created (if empty)."""
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    for d in reversed(target.created_parents):
        try:
            d.rmdir()
        except OSError:
            break


def remove_stale_partials(out: Path) -> None:
    """Remove temporary folders left by killed merges into the same target (their process is gone)."""
    host_pid = os.getpid()
    for p in out.parent.glob(f".{out.name}{PARTIAL_MARK}*"):
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != host_pid and not _alive(int(pid)) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def commit(tmp: Path, target: FolderTarget) -> None:
    """Move the finished temp folder into place without replacing anything that appeared meanwhile."""
    out = target.path
    if out.exists() or out.is_symlink():
        st = os.lstat(out)
        if target.replaces != (st.st_dev, st.st_ino) or not stat.S_ISDIR(st.st_mode):
            raise RamStudioError(f"{out} appeared while this merge was running; it was not replaced.",
                                 "Choose another output folder and run the merge again.")
        if not any(out.iterdir()):
            out.rmdir()
        else:
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

"""Where outputs may go, and how they appear: the rules that keep a merge from destroying its inputs.

- An output (a model folder, an analysis file, the analysis cache) may not be, contain, or lie inside any
  input. Paths are compared by identity, not by spelling: the (device, inode) of the output and of every
  existing ancestor against each input folder, each file in it and each file its links point to, and the
  ancestors of each input — so symlinks, bind mounts and `..` cannot hide an input. For a Hugging Face cache
  snapshot the input is the whole cached repo; an output elsewhere in the Hub cache is allowed with a warning.
- A folder output may not be a file, a symlink, a mount point, or a folder owned by another user. An
  existing non-empty folder is replaced only with `overwrite`, and only when this tool wrote it (it holds our
  recipe and only files we write).
- One writer per target: an exclusive lock (`.NAME.lock` beside it) is held from the start of a merge
  to the final rename, and a second writer fails fast naming the first.
- Work happens in a hidden sibling `.NAME.partial-…` holding our marker file; a leftover of a killed merge is
  removed only when it is provably ours: our marker, naming this target, written on this host by a process
  that is gone — and it is not an input and holds none.
- The finished temporary folder is renamed into place without replacing anything that appeared
  meanwhile (renameat2 RENAME_NOREPLACE); an old folder being overwritten is moved aside only after
  checking it is still the one that was checked at the start.
CLI and app both call `check_output_folder` / `check_output_file` (the app before it starts a job).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from merging.common.errors import RamStudioError
from merging.reading.model_folder import hub_blob_store
from merging.recipe import RECIPE_NAME
from merging.common.untrusted import loads_json

PARTIAL_MARK = ".partial-"
PARTIAL_MARKER = ".ram-studio-partial"  # written first into every temporary folder: what proves it ours
# Files a merge writes (besides copied side files, whose names the side-file allow-list gives).
WRITTEN_NAMES = ("config.json", "README.md", RECIPE_NAME, "mergekit.yaml", "model.safetensors",
                 "model.safetensors.index.json")

Identity = tuple[int, int]  # (st_dev, st_ino)


@dataclass(frozen=True)
class Protected:
    """Something no output may be, contain or sit inside: a real path, its identity and the identities of
    its ancestors (unset when it does not exist yet, e.g. a Hub repo not downloaded), and the input it
    belongs to (for the message)."""

    path: Path
    input: str
    ident: Identity | None = None
    above: frozenset[Identity] = frozenset()


def identity(path: Path | str) -> Identity | None:
    """(device, inode) of `path` (following links), or None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _protect(path: Path, label: str) -> Protected:
    real = Path(path).resolve()
    return Protected(real, label, identity(real), frozenset(i for i in map(identity, real.parents) if i))


def protected_paths(folders: Iterable[tuple[str, Path]]) -> list[Protected]:
    """Every input folder (the whole cached repo for a Hub snapshot), the files in it and the files its
    links point to, with their identities."""
    out: list[Protected] = []
    for label, folder in folders:
        real = Path(folder).resolve()
        store = hub_blob_store(real)
        out.append(_protect(store.parent if store is not None else real, label))
        if store is not None:
            out.append(_protect(real, label))
        try:
            entries = list(Path(folder).iterdir())
        except OSError:
            entries = []
        for p in entries:
            out.append(_protect(p, label))  # the file, or what its link points to
    return out


def input_folders(refs: Iterable[str]) -> list[Protected]:
    """Protected paths for model references before anything is downloaded or opened: the folder of a
    local or demo model, the cached repo folder of a Hub model (where its snapshot will be)."""
    from merging.reading.refs import parse_ref

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


def _chain(real: Path) -> tuple[Identity | None, list[Identity]]:
    """The identity of `real` (None when it does not exist) and those of its existing ancestors."""
    return identity(real), [i for i in map(identity, real.parents) if i]


def _clash(real: Path, inputs: list[Protected], what: str) -> None:
    """Refuse an output that is, contains or lies inside an input: by identity, and by path for inputs that
    do not exist yet."""
    own, ancestors = _chain(real)
    for p in inputs:
        if p.ident is not None and own == p.ident:
            relation = "is"
        elif p.ident is not None and p.ident in ancestors:
            relation = "is inside"
        elif own is not None and own in p.above:
            relation = "contains"
        elif real == p.path:
            relation = "is"
        elif p.path in real.parents:
            relation = "is inside"
        elif real in p.path.parents:
            relation = "contains"
        else:
            continue
        raise RamStudioError(f"the {what} {real} {relation} the input {p.input} ({p.path}).",
                             "Write outputs outside every input folder: an output must never replace, "
                             "contain or sit inside a model it reads (the same folder reached through a link "
                             "or a bind mount counts as the folder).")


def refuse_inside_inputs(path: Path | str, inputs: list[Protected], what: str) -> Path:
    """`path` resolved, after checking it is not, does not contain and does not lie inside any input."""
    real = _real(Path(path))
    _clash(real, inputs, what)
    return real


def hub_cache_warning(real: Path) -> str | None:
    """A warning when an output would be written inside the Hugging Face cache (which the Hub client
    manages: a cache clean-up may delete it); None elsewhere."""
    from huggingface_hub import constants

    cache = Path(constants.HF_HUB_CACHE)
    cache_id = identity(cache)
    own, ancestors = _chain(real)
    inside = (cache_id is not None and (cache_id == own or cache_id in ancestors)) or \
        any(a.name.startswith(("models--", "datasets--", "spaces--")) for a in real.parents)
    if not inside:
        return None
    return (f"{real} is inside the Hugging Face cache ({cache}); the Hub client manages that folder, and a cache "
            "clean-up may delete what is written there. Consider another folder.")


def written_by_us(folder: Path, side_file_ok) -> str | None:
    """Why `folder` is not a folder this tool wrote (None when it is): it must hold our recipe and only
    regular files a merge writes."""
    recipe = folder / RECIPE_NAME
    try:
        doc = loads_json(recipe.read_text()) if recipe.is_file() and not recipe.is_symlink() else None
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
    """A checked output folder: where it goes, the folder it may replace (its identity at check time), the
    inputs it was checked against (stale temporary folders are judged against them too) and warnings."""

    path: Path
    replaces: Identity | None = None  # (st_dev, st_ino) of an existing folder we may replace
    created_parents: list[Path] = field(default_factory=list)
    inputs: list[Protected] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    side_file_ok: Callable[[str], bool] = lambda name: False


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
    warning = hub_cache_warning(real)
    target = FolderTarget(path, None, inputs=list(inputs), warnings=[warning] if warning else [],
                          side_file_ok=side_file_ok)
    if not real.exists():
        return target
    st = real.stat()
    _refuse_foreign(path, real, st)
    target.replaces = (st.st_dev, st.st_ino)
    if not any(real.iterdir()):
        return target
    if not overwrite:
        raise RamStudioError(f"output folder {path} exists and is not empty.",
                             "Choose another folder, or allow overwriting (CLI: --overwrite; app: the "
                             "'Overwrite' box) to replace a folder RAM Studio wrote.")
    why = written_by_us(real, side_file_ok)
    if why:
        raise RamStudioError(f"refusing to overwrite {path}: {why}.",
                             "Only an empty folder or a merged model written by RAM Studio is replaced; "
                             "choose another output folder.")
    return target


def _refuse_foreign(path: Path, real: Path, st: os.stat_result) -> None:
    """An existing output folder is replaced by a rename beside it: never a mount point (the rename cannot
    replace it, and what is mounted there is not ours), never a folder another user owns."""
    if is_mount_point(real):
        raise RamStudioError(f"the output folder {path} is a mount point.",
                             "A merge is written beside its folder and renamed into place, which cannot replace "
                             f"a mount point: write into a folder inside it instead (e.g. {path / 'merged'}).")
    if st.st_uid != os.geteuid():
        raise RamStudioError(f"the output folder {path} belongs to another user (uid {st.st_uid}); it is never "
                             "replaced.", "Choose a folder of your own (or a new folder name).")


def is_mount_point(real: Path) -> bool:
    """Whether `real` (a resolved path) is a mount point, bind mounts of a folder on the same disk included
    (which `os.path.ismount` does not see): from /proc/self/mountinfo where there is one."""
    if os.path.ismount(real):
        return True
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    unescape = lambda text: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)  # noqa: E731
    return any(len(f) > 4 and Path(unescape(f[4])) == real for f in (line.split(" ") for line in lines))


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


def commit(tmp: Path, target: FolderTarget) -> None:
    """Move the finished temp folder into place without replacing anything that appeared meanwhile."""
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

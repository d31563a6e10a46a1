"""Where outputs may go: the rules that keep a merge from destroying its inputs.

- An output (a model folder, an analysis file, the analysis cache) may not be, contain, or lie inside any
  input. Paths are compared by identity, not by spelling: the (device, inode) of the output and of every
  existing ancestor against each input folder, each file in it and each file its links point to, and the
  ancestors of each input — so symlinks, bind mounts and `..` cannot hide an input. For a Hugging Face cache
  snapshot the input is the whole cached repo; an output elsewhere in the Hub cache is allowed with a warning.
- A folder output may not be a file, a symlink, a mount point, or a folder owned by another user. An
  existing non-empty folder is replaced only with `overwrite`, and only when this tool wrote it (it holds our
  recipe and only files we write).
CLI and app both call `check_output_folder` (the app before it starts a job); how a checked folder is then written
(one writer, a temporary sibling, the final rename, the placement checked again) is merging/writing/commit.py.
Files (reports) and the folders written all along a run (caches, the score store) are checked again when they are
written, through a directory handle opened at check time: merging/writing/checked_output.py.
"""
from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from merging.common.errors import RamStudioError
from merging.common.untrusted import loads_json
from merging.reading.model_folder import hub_blob_store
from merging.recipe import RECIPE_NAME

PARTIAL_MARK = ".partial-"  # temporary siblings are named .NAME.partial-XXXXXXXX-PID
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


def protected_files(files: Iterable[tuple[str, Path]]) -> list[Protected]:
    """Single input files (e.g. the side tensors a merge reads), each with what its link points to."""
    return [_protect(Path(f), label) for label, f in files]


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


def _clash(real: Path, inputs: list[Protected], what: str, contains_ok: bool = False) -> None:
    """Refuse an output that is, contains (unless `contains_ok`) or lies inside an input: by identity, and by
    path for inputs that do not exist yet."""
    own, ancestors = _chain(real)
    for p in inputs:
        if p.ident is not None and own == p.ident:
            relation = "is"
        elif p.ident is not None and p.ident in ancestors:
            relation = "is inside"
        elif own is not None and own in p.above and not contains_ok:
            relation = "contains"
        elif real == p.path:
            relation = "is"
        elif p.path in real.parents:
            relation = "is inside"
        elif real in p.path.parents and not contains_ok:
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


def check_hub_cache(refs: Iterable[str]) -> None:
    """Before Hub models are downloaded: the Hugging Face cache the files go into is not, and does not lie inside,
    one of the local model folders named beside them (it may hold them: a snapshot folder given as a path is
    inside the cache by design)."""
    from huggingface_hub import constants

    from merging.reading.refs import parse_ref

    local = []
    for ref in refs:
        try:
            r = parse_ref(ref)
        except RamStudioError:
            continue
        if r.kind != "hub" and r.path is not None:
            local.append((ref, r.path))
    try:
        _clash(_real(Path(constants.HF_HUB_CACHE)), protected_paths(local), "Hugging Face cache folder",
               contains_ok=True)
    except RamStudioError as exc:
        raise RamStudioError(exc.message, "Point HF_HUB_CACHE (or HF_HOME) at a folder outside every model folder "
                             "before downloading.") from None


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
    temp: Identity | None = None  # the temporary sibling once made: it must still be there, the same, at the rename


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
                             "'Overwrite' box; Python: overwrite=True) to replace a folder RAM Studio wrote.")
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

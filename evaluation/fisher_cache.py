"""Where diagonal Fishers are kept: the analysis cache's `fisher/` folder, one float32 safetensors file per
(agent content, task data, answer rule, seed, N), named by a hash of all of it, with a JSON sidecar saying how
it was computed.

The analysis cache's rules apply: the folder may not be, contain or lie inside an input (checked when the
Fisher pass starts and again before each file is published); files are written through the folder's handle
opened at the check (`merging/writing/checked_output.py: CheckedFolder`), under a temporary name of our pattern,
and published with a rename that never replaces another writer's file (two processes computing the same
Fisher keep the first); a temporary file a killed writer left is removed only when provably ours
(analysis.cache.remove_orphans). A
file is written one tensor at a time, each checked finite first. Reading back: the sidecar is parsed with
the bounded JSON reader and must name its key; the safetensors file must be a regular file whose size and
header hash are those the sidecar recorded.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from analysis.cache import HINT, cache_dir, host_name, remove_orphans
from merging.common.errors import RamStudioError
from merging.common.untrusted import TooComplex, loads_json
from merging.reading.checkpoint import Checkpoint
from merging.reading.safetensors_header import read_header
from merging.writing.checked_output import CheckedFolder
from merging.writing.shards import PlannedTensor, encode_header

FISHER_FORMAT = 1  # bump when what a key stands for changes (the loss, the estimator, the file layout)
MAX_SIDECAR_BYTES = 1 << 20


def fisher_dir() -> Path:
    """$RAM_STUDIO_CACHE/fisher, else ~/.cache/ram-studio/analysis/fisher."""
    return cache_dir() / "fisher"


def fisher_key(agent_weights: str, source: str, task: str, split: str, rule: str, seed: int, n: int,
               examples_sha256: str) -> str:
    """The cache key: the agent's content fingerprint, where the data comes from, the task and split, the rule,
    the seed, N and a hash of the first N examples' text (32 hex digits)."""
    text = json.dumps([FISHER_FORMAT, agent_weights, source, task, split, rule, seed, n, examples_sha256])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class FisherFile:
    """A Fisher in the cache: the safetensors file and its sidecar (how it was computed)."""

    path: Path
    sidecar: dict[str, Any]

    @property
    def key(self) -> str:
        return self.sidecar["key"]

    @property
    def seconds(self) -> float:
        """The pass's seconds of compute to this N."""
        return float(self.sidecar.get("seconds", 0.0))


def _paths(key: str) -> tuple[Path, Path]:
    folder = fisher_dir()
    return folder / f"{key}.safetensors", folder / f"{key}.json"


def lookup(key: str) -> FisherFile | None:
    """The cached Fisher for `key`, or None when it is absent, damaged or does not match its sidecar."""
    path, side = _paths(key)
    try:
        if side.is_symlink() or path.is_symlink() or side.stat().st_size > MAX_SIDECAR_BYTES:
            return None
        doc = loads_json(side.read_text())
        if not isinstance(doc, dict) or doc.get("key") != key or doc.get("format") != FISHER_FORMAT:
            return None
        header = read_header(path)
        if header.file_size != doc.get("file_bytes") or header.header_sha256 != doc.get("header_sha256"):
            return None
    except (OSError, ValueError, TooComplex, UnicodeDecodeError, RamStudioError):
        return None
    return FisherFile(path, doc)


def check_cache_location(models: list[Checkpoint], task_folder: Path | None = None) -> CheckedFolder:
    """The Fisher folder, opened under the placement rules: never is, contains or lies inside one of the inputs —
    the models, and the lm-eval task folder the data comes from (`task_folder`) — like the analysis cache; the
    handle is what `publish` writes through."""
    from merging.writing.placement import protected_paths

    named = [(c.ref.raw, c.folder) for c in models] + ([("--include-path", Path(task_folder))] if task_folder else [])
    return CheckedFolder(fisher_dir(), protected_paths(named), "Fisher cache folder", HINT)


def publish(key: str, planned: list[PlannedTensor], tensors: Iterator[tuple[str, torch.Tensor]],
            sidecar: dict[str, Any], folder: CheckedFolder) -> FisherFile:
    """Write the Fisher tensors (one at a time, float32, each checked finite) and the sidecar under `key` in the
    checked `folder`; an entry another writer published first is kept (and returned) instead."""
    remove_orphans(folder)
    path, side = _paths(key)

    def write_tensors(f) -> None:
        f.write(encode_header(planned, {"format": "pt", "ram_studio": "diagonal fisher"}))
        for plan, (name, t) in zip(planned, tensors):
            if name != plan.name or tuple(t.shape) != plan.shape:
                raise RuntimeError(f"Fisher tensor {name} arrived out of plan")
            if not bool(torch.isfinite(t).all()):
                raise RamStudioError(f"the Fisher of tensor {name!r} overflows float32 (NaN or Inf).",
                                     "The agent's gradients are too large to square in float32; nothing was "
                                     "written.")
            f.write(t.to(torch.float32).contiguous().numpy().tobytes())

    _write_and_publish(folder, key, path.name, write_tensors)
    header = read_header(path)  # what is published (another writer's identical file, if it came first)
    doc = {**sidecar, "format": FISHER_FORMAT, "key": key, "file": path.name, "file_bytes": header.file_size,
           "header_sha256": header.header_sha256}
    _write_and_publish(folder, key, side.name, lambda f: f.write(json.dumps(doc, indent=1).encode()))
    found = lookup(key)
    if found is None:
        raise RamStudioError(f"the Fisher cache entry {key} cannot be read back from {folder.path}.",
                             "Another process may be writing it; try again.")
    return found


def _write_and_publish(folder: CheckedFolder, key: str, name: str, write: Callable[[Any], None]) -> None:
    """`write` a temporary file of ours in `folder`, flushed to disk, then publish it as `name` (never replacing
    what another writer published first); the temporary file is removed if anything fails."""
    tmp = _tmp(key)
    try:
        with folder.create(tmp) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _forget(folder, tmp)
        raise
    folder.publish(tmp, name)


def _forget(folder: CheckedFolder, tmp: str) -> None:
    """Remove our own temporary file after a failed write (gone already: nothing to do)."""
    try:
        folder.unlink(tmp)
    except OSError:
        pass


def _tmp(key: str) -> str:
    return f".{key}.{host_name()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"

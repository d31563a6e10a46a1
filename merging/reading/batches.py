"""Reading many small tensors at once: the tensors of a batch are laid end to end, one row per model (base first),
so that one kernel call handles all of them; runs of tensors stored back to back are read with one `preadv`
each. A model with 100,000 tiny tensors is otherwise read (and computed on) one tensor at a time, which costs
far more per tensor than its elements do.

Only tensors that every agent stores alike (same dtype and shape, in a plain safetensors entry) go in batches;
the others keep the chunked reader (merging/reading/chunks.py). Every byte is read once, by offset, and hashed
for the inputs' fingerprints like the chunked reader's reads.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from merging.common.dtypes import ITEMSIZE
from merging.reading.checkpoint import Checkpoint
from merging.reading.chunks import ShardFiles
from merging.reading.fingerprint import Fingerprinter
from merging.reading.mapped import MappedEntry
from merging.reading.safetensors_header import TensorEntry

SMALL_ELEMS = 1 << 14  # tensors of at most this many elements are read and computed on in batches
BATCH_ELEMS = 1 << 21  # elements of one batch (per model)
BATCH_TENSORS = 1 << 14
NUMPY = {"BF16": np.uint16, "F32": np.float32, "F16": np.float16, "F64": np.float64}  # bf16 as its bit patterns


def batchable(name: str, base: Checkpoint, agents: list[Checkpoint]) -> bool:
    """Whether a tensor can be read in a batch: small, not empty, a dtype numpy reads, and stored alike by
    every agent (same dtype and shape, a plain entry: not read through a layout mapping, not missing)."""
    e = base.tensors[name]
    if e.dtype not in NUMPY or not 0 < e.numel <= SMALL_ELEMS or isinstance(e, MappedEntry):
        return False
    for a in agents:
        x = a.tensors.get(name)
        if x is None or isinstance(x, MappedEntry) or x.dtype != e.dtype or tuple(x.shape) != tuple(e.shape):
            return False
    return True


def plan_batches(names: list[str], base: Checkpoint, agents: list[Checkpoint],
                 min_tensors: int = 1) -> tuple[list[list[str]], list[str]]:
    """The batchable tensors of `names` in batches (each of one stored dtype, in `names` order), and the rest.
    With fewer than `min_tensors` batchable tensors, none are batched."""
    small = [n for n in names if batchable(n, base, agents)]
    if len(small) < min_tensors:
        return [], list(names)
    chosen = set(small)
    by_dtype: dict[str, list[str]] = {}
    for n in small:
        by_dtype.setdefault(base.tensors[n].dtype, []).append(n)
    batches: list[list[str]] = []
    for group in by_dtype.values():
        batch: list[str] = []
        elems = 0
        for n in group:
            size = base.tensors[n].numel
            if batch and (elems + size > BATCH_ELEMS or len(batch) >= BATCH_TENSORS):
                batches.append(batch)
                batch, elems = [], 0
            batch.append(n)
            elems += size
        batches.append(batch)
    return batches, [n for n in names if n not in chosen]


class BatchReader:
    """Reads batches of small tensors from the base and the agents (see `plan_batches`)."""

    def __init__(self, base: Checkpoint, agents: list[Checkpoint], fingerprinter: Fingerprinter | None = None) -> None:
        self.models = [base, *agents]
        self.fingerprinter = fingerprinter
        self.files = ShardFiles()
        for c in self.models:
            self.files.register(c)

    def read(self, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(stage, starts): stage (1 + N, E) in the stored dtype (bf16 as uint16 bit patterns), base first; tensor
        i holds elements [starts[i], starts[i + 1]) of each row."""
        base = self.models[0]
        first = base.tensors[names[0]]
        sizes = np.array([base.tensors[n].numel for n in names], dtype=np.int64)
        starts = np.zeros(len(names) + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        stage = np.empty((len(self.models), int(starts[-1])), dtype=NUMPY[first.dtype])
        item = ITEMSIZE[first.dtype]
        for m, model in enumerate(self.models):
            entries = [model.tensors[n] for n in names]
            row = memoryview(stage[m].view(np.uint8))
            for entry, lo, hi in _runs(entries, starts * item):
                self.files.read_into(entry, 0, row[lo:hi])
            if self.fingerprinter is not None:
                for e, lo, hi in zip(entries, starts[:-1] * item, starts[1:] * item):
                    self.fingerprinter.add_bytes(m, e.name, 0, e.shape[0] if e.shape else 1, row[lo:hi])
        return stage, starts

    def close(self) -> None:
        self.files.close()


def _runs(entries: list[TensorEntry], offsets: np.ndarray) -> Iterator[tuple[TensorEntry, int, int]]:
    """(first entry, destination byte range) of each run of tensors that lie back to back both in one file and
    in the destination row: one read each."""
    run_entry, lo, hi = None, 0, 0
    for i, e in enumerate(entries):
        dest = int(offsets[i])
        if run_entry is not None and e.file == run_entry.file and e.begin == run_entry.begin + (hi - lo) \
                and dest == hi:
            hi = int(offsets[i + 1])
            continue
        if run_entry is not None:
            yield run_entry, lo, hi
        run_entry, lo, hi = e, dest, int(offsets[i + 1])
    if run_entry is not None:
        yield run_entry, lo, hi

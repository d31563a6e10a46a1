"""Reading many small tensors at once: the tensors of a batch are laid end to end, one row per model (base first),
so that one kernel call handles all of them; runs of tensors stored back to back are read with one `preadv`
each. A model with 100,000 tiny tensors is otherwise read (and computed on) one tensor at a time, which costs
far more per tensor than its elements do.

Only tensors that every agent has in the base's dtype and shape (stored so, or read in the base's layout through
merging/reading/mapped.py) go in batches; the others keep the chunked reader (merging/reading/chunks.py). Every
byte is read once, by offset, and hashed for the inputs' fingerprints like the chunked reader's reads.
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
BATCH_ELEMS = 1 << 20  # elements of one batch (per model)
BATCH_TENSORS = 1 << 12  # (the kernel's per-tensor outputs: ~4 KB each with 3 agents and 8 ε)
ENTRIES = (TensorEntry, MappedEntry)  # an agent's tensor as stored, or read in the base's layout
NUMPY = {"BF16": np.uint16, "F32": np.float32, "F16": np.float16, "F64": np.float64}  # bf16 as its bit patterns


def plan_batches(names: list[str], base: Checkpoint, agents: list[Checkpoint],
                 min_tensors: int = 1) -> tuple[list[list[str]], list[str]]:
    """The tensors of `names` that can be read in batches, in batches (each of one stored dtype, in `names` order),
    and the rest. A tensor goes in a batch when it is small, not empty, of a dtype numpy reads, and stored alike by
    every agent (same dtype and shape, as stored or read in the base's layout; not missing). With fewer
    than `min_tensors` such tensors, none are batched."""
    bt, ats = base.tensors, [a.tensors for a in agents]
    by_dtype: dict[str, list[tuple[str, int]]] = {}
    for n in names:
        e = bt[n]
        if type(e) is not TensorEntry or e.dtype not in NUMPY:
            continue
        size = (e.end - e.begin) // ITEMSIZE[e.dtype]
        if 0 < size <= SMALL_ELEMS and all(type(x := t.get(n)) in ENTRIES and x.dtype == e.dtype
                                           and tuple(x.shape) == e.shape for t in ats):
            by_dtype.setdefault(e.dtype, []).append((n, size))
    if sum(map(len, by_dtype.values())) < min_tensors:
        return [], list(names)
    batches: list[list[str]] = []
    for group in by_dtype.values():
        batch: list[str] = []
        elems = 0
        for n, size in group:
            if batch and (elems + size > BATCH_ELEMS or len(batch) >= BATCH_TENSORS):
                batches.append(batch)
                batch, elems = [], 0
            batch.append(n)
            elems += size
        batches.append(batch)
    chosen = {n for b in batches for n in b}
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
        entries = [base.tensors[n] for n in names]
        sizes = np.array([e.end - e.begin for e in entries], dtype=np.int64) // ITEMSIZE[first.dtype]
        starts = np.zeros(len(names) + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        stage = np.empty((len(self.models), int(starts[-1])), dtype=NUMPY[first.dtype])
        item = ITEMSIZE[first.dtype]
        bounds = (starts * item).tolist()
        for m, model in enumerate(self.models):
            entries = [model.tensors[n] for n in names]
            row = memoryview(stage[m].view(np.uint8))
            plain = [i for i, e in enumerate(entries) if type(e) is TensorEntry]
            for entry, lo, hi in _runs([entries[i] for i in plain], [bounds[i] for i in plain],
                                       [bounds[i + 1] for i in plain]):
                self.files.read_into(entry, 0, row[lo:hi])
            for i in (i for i, e in enumerate(entries) if type(e) is not TensorEntry):  # read in the base's layout
                for src, at, byte, nbytes in entries[i].byte_pieces(0, bounds[i + 1] - bounds[i]):
                    self.files.read_into(src, byte, row[bounds[i] + at:bounds[i] + at + nbytes])
            if self.fingerprinter is not None:
                self.fingerprinter.add_tensors(m, [(e.name, row[lo:hi]) for e, lo, hi in
                                                   zip(entries, bounds[:-1], bounds[1:])])
        return stage, starts

    def close(self) -> None:
        self.files.close()


def _runs(entries: list[TensorEntry], lo: list[int], hi: list[int]) -> Iterator[tuple[TensorEntry, int, int]]:
    """(first entry, destination byte range) of each run of tensors that lie back to back both in one file and in
    the destination row (tensor i goes to bytes [lo[i], hi[i])): one read each."""
    if not entries:
        return
    ids: dict[object, int] = {}
    files = np.array([ids.setdefault(e.file, len(ids)) for e in entries], dtype=np.int64)
    begins = np.array([e.begin for e in entries], dtype=np.int64)
    ends = np.array([e.end for e in entries], dtype=np.int64)
    dest_lo, dest_hi = np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64)
    apart = (files[1:] != files[:-1]) | (begins[1:] != ends[:-1]) | (dest_lo[1:] != dest_hi[:-1])
    cuts = np.flatnonzero(np.r_[True, apart]).tolist()
    for k, i in enumerate(cuts):
        j = cuts[k + 1] if k + 1 < len(cuts) else len(entries)
        yield entries[i], lo[i], hi[j - 1]

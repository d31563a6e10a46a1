"""Inputs held in memory for many merges of the same models (a sweep): read once, served like a ChunkReader.

`ResidentReader` reads base and agents once, span by span at the engine's chunk size, and keeps each span's
stored values (the staging layout the fused CPU kernels read in place), or their float32 form on the
compute device when that is a GPU. The engine (`stream_merge`, `count_overlaps`) then runs on it exactly as
on the files: same spans, same methods, same kernels, same output checks — so a candidate merged from
memory is bit for bit the `ram-studio merge` of it. Whether the inputs fit is decided by `resident_bytes`
against the free memory (`fits_in_memory`); where they do not, callers stream from the files instead.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Iterator

import torch

from merging.common.device import chunk_elems_for, fits_on_device
from merging.common.dtypes import FLOAT_CODES, ITEMSIZE
from merging.reading.checkpoint import Checkpoint, tensor_order
from merging.reading.chunks import DEFAULT_CHUNK_ELEMS, ChunkData, ChunkReader, Span, row_spans
from merging.reading.fingerprint import Fingerprinter

HOST_SHARE = 0.5  # resident inputs may take at most this share of the memory available now


def resident_bytes(base: Checkpoint, agents: list[Checkpoint], device: torch.device) -> int:
    """Bytes the inputs take once resident: stored values on the host, float32 for float tensors on a GPU."""
    total = 0
    for e in base.tensors.values():
        size = ITEMSIZE[e.dtype]
        if device.type == "cuda" and e.dtype in FLOAT_CODES:
            size = 4
        total += e.numel * size * (1 + len(agents))
    return total


def available_host_bytes() -> int:
    """Memory the system could give this process now (MemAvailable), or 0 when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def fits_in_memory(base: Checkpoint, agents: list[Checkpoint], device: torch.device) -> bool:
    """Whether the inputs can stay resident: on a GPU within half its free memory, on the host within
    HOST_SHARE of the available memory ($RAM_STUDIO_RESIDENT_BYTES overrides the host budget)."""
    need = resident_bytes(base, agents, device)
    if device.type == "cuda":
        return fits_on_device(device, need)
    budget = os.environ.get("RAM_STUDIO_RESIDENT_BYTES", "").strip()
    limit = int(budget) if budget.isdigit() else int(available_host_bytes() * HOST_SHARE)
    return need <= limit


class ResidentReader:
    """The spans of every tensor of base and agents, read once and kept; `stream`/`read` hand out ChunkData
    marked `resident` (the engine then never works on them in place) whose `release` is a no-op.

    On a CUDA `device` float tensors are kept as float32 on the device (already widened; the engine's
    upload is then a no-op); elsewhere the stored dtype stays on the host, where the kernels read it."""

    def __init__(self, base: Checkpoint, agents: list[Checkpoint], *, device: torch.device,
                 chunk_elems: int = DEFAULT_CHUNK_ELEMS, fingerprinter: Fingerprinter | None = None,
                 read_threads: int | None = None, widen: bool | None = None) -> None:
        self.base, self.agents = base, agents
        self.device = device
        self.chunk_elems = chunk_elems_for(device, chunk_elems, DEFAULT_CHUNK_ELEMS)
        self.widen = device.type == "cuda" if widen is None else widen
        self._spans: dict[tuple[str, int, int], ChunkData] = {}
        self.nbytes = 0
        reader = ChunkReader(base, agents, fingerprinter, threads=read_threads)
        try:
            spans = [s for n in tensor_order(base) for s in row_spans(n, base.tensors[n].shape, self.chunk_elems)]
            for span, data in reader.stream((s, s) for s in spans):
                try:
                    self._spans[(span.tensor, span.start, span.stop)] = self._keep(data)
                finally:
                    data.release()
        finally:
            reader.close()

    def _keep(self, data: ChunkData) -> ChunkData:
        """A copy of a span that outlives the reader's buffers (float32 on the device when widening)."""
        is_float = self.base.tensors[data.span.tensor].dtype in FLOAT_CODES
        widen = self.widen and is_float

        def own(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            t = t.to(self.device, torch.float32) if widen else t.clone()
            self.nbytes += t.numel() * t.element_size()
            return t

        if data.stage is not None:
            stage = own(data.stage)
            shape = data.base.shape
            agents = [None if a is None else stage[m].view(shape) for m, a in enumerate(data.agents, start=1)]
            kept = ChunkData(data.span, stage[0].view(shape), agents, stage, resident=True)
        else:
            kept = ChunkData(data.span, own(data.base), [own(a) for a in data.agents], resident=True)
        return kept

    def read(self, span: Span) -> ChunkData:
        """The span's data (spans are those of `chunk_elems`: pass `reader.chunk_elems` to the engine)."""
        try:
            return self._spans[(span.tensor, span.start, span.stop)]
        except KeyError:
            raise ValueError(f"span {span} is not one this reader holds: the engine must use chunk_elems="
                             f"{self.chunk_elems}") from None

    def stream(self, items: Iterable[tuple[Span | None, Any]],
               depth: int = 2) -> Iterator[tuple[Any, ChunkData | None]]:
        """Like ChunkReader.stream: (tag, data) for each (span or None, tag); nothing is read."""
        for span, tag in items:
            yield tag, (None if span is None else self.read(span))

    def close(self) -> None:
        """Nothing to close: the data stays for the next merge (drop the reader to free it)."""

"""Single passes over the inputs, shared by the merge engine, the counting pass and the analysis.

Chunk iteration aligned across base and agents (`float_chunks`), progress in bytes of input, the choice
between the fused CPU kernels and torch, and the finiteness checks that name the first NaN/Inf input.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from merging.common.device import Lanes, chunk_elems_for
from merging.common.dtypes import FLOAT_CODES, ITEMSIZE
from merging.common.errors import MergeCancelled, RamStudioError
from merging.kernels import kernels_enabled, prepare, settle
from merging.kernels import ready as kernels_ready
from merging.reading.checkpoint import Checkpoint, tensor_order
from merging.reading.chunk_inputs import ChunkInputs
from merging.reading.chunks import DEFAULT_CHUNK_ELEMS, BufferPool, ChunkData, ChunkReader, row_spans
from merging.reading.fingerprint import Fingerprinter


@dataclass
class Progress:
    """Where a streaming job stands; `done`/`total` count bytes of input processed (passes included)."""

    phase: str
    done: int
    total: int
    tensors_done: int
    tensors_total: int
    tensor: str
    elapsed: float

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0

    @property
    def eta(self) -> float | None:
        if self.done <= 0 or self.elapsed <= 0:
            return None
        return self.elapsed * (self.total - self.done) / self.done


ProgressFn = Callable[[Progress], None]


class ProgressTracker:
    """Calls a progress callback at most every `interval` seconds, and always at the end."""

    def __init__(self, phase: str, total: int, tensors_total: int, callback: ProgressFn | None,
                 interval: float = 0.2) -> None:
        self.phase, self.total, self.tensors_total = phase, total, tensors_total
        self.callback, self.interval = callback, interval
        self.done = 0
        self.tensors_done = 0
        self.start = time.perf_counter()
        self._last = 0.0

    def advance(self, nbytes: int, tensor: str, tensor_finished: bool | int = False, force: bool = False) -> None:
        """Count `nbytes` more done, and the tensor finished (or, given a number, that many tensors)."""
        self.done += nbytes
        self.tensors_done += int(tensor_finished)
        now = time.perf_counter()
        if self.callback and (force or now - self._last >= self.interval):
            self._last = now
            self.callback(Progress(self.phase, self.done, self.total, self.tensors_done, self.tensors_total,
                                   tensor, now - self.start))


def build_inputs(data: ChunkData, lanes: Lanes, fused: bool) -> tuple[ChunkInputs, Any]:
    """The chunk, converted to float32 on the device (lazily on the CPU: the fused kernels read the stored
    values), and the event after which its staging buffer may be reused (None: once the caller is done)."""
    # Resident inputs (a sweep's) serve many merges: τ is then never computed in place over them.
    chunk = ChunkInputs(data.base, data.agents, lanes.device, keep_agents=fused or data.resident, stage=data.stage)
    if lanes.cuda and data.stage is not None:
        models, event = lanes.upload(data.stage)
        chunk.set_models(models)
        return chunk, event
    return chunk, None


def uses_kernels(device: torch.device) -> bool:
    """Whether work on `device` goes through the fused CPU kernels (once they are ready)."""
    return device.type == "cpu" and kernels_enabled()


GUARD_KERNELS = ("first_nonfinite", "values_differ")


def kernel_dtype(models: list[Checkpoint]) -> str:
    """What the kernels will read for these models: 'bf16' when every float tensor is stored in bf16."""
    return "bf16" if all(e.dtype == "BF16" for c in models for e in c.tensors.values() if e.dtype in FLOAT_CODES) \
        else "f32"


def prepare_kernels(device: torch.device, names: tuple[str, ...], models: list[Checkpoint]) -> str:
    """Ask for the kernels a pass needs (see merging.kernels.prepare) without waiting: they load while
    the first chunks are read (see `fused_now`). Returns their dtype key."""
    dtype = kernel_dtype(models)
    if uses_kernels(device):
        prepare(names, (dtype,), wait=False)
    return dtype


def fused_now(device: torch.device, names: tuple[str, ...], dtype: str, first: bool = False) -> bool:
    """Whether the fused kernels run this chunk (or tensor): on the CPU, once they are ready; never when no
    kernel is named (a method without kernels runs the torch path). Before the `first` one, wait for
    kernels that are being loaded from numba's cache (never for a compile)."""
    if not names or not uses_kernels(device):
        return False
    if first:
        settle(names, dtype)
    return kernels_ready(names, dtype)


def open_reader(base: Checkpoint, agents: list[Checkpoint], fingerprinter: Fingerprinter | None, lanes: Lanes,
            read_threads: int | None) -> ChunkReader:
    return ChunkReader(base, agents, fingerprinter, threads=read_threads, pool=BufferPool(pinned=lanes.cuda, keep=4))


def float_chunks(base: Checkpoint, agents: list[Checkpoint], *, phase: str, device: torch.device,
                 chunk_elems: int = DEFAULT_CHUNK_ELEMS, progress: ProgressFn | None = None,
                 cancel: threading.Event | None = None, fingerprinter: Fingerprinter | None = None,
                 read_threads: int | None = None, kernels: tuple[str, ...] = (), reader: Any = None,
                 names: list[str] | None = None, tracker: ProgressTracker | None = None
                 ) -> Iterator[tuple[ChunkData, ChunkInputs, bool, bool]]:
    """Every float tensor of the base, chunk by chunk and aligned with the agents, read ahead on reader
    threads: (stored data, its ChunkInputs, whether it is the tensor's last chunk, whether to use the
    fused `kernels` for it). The single-pass readers (the counting pass, the analysis) share this;
    progress is reported in bytes of input. Data and inputs are valid until the next chunk is asked for.
    A `reader` given (e.g. merging.reading.resident.ResidentReader) is used instead of reading the files, and left open.
    `names` (in order) limits the pass to those tensors; a `tracker` given counts their progress (with other work's)."""
    chunk_elems = chunk_elems_for(device, chunk_elems, DEFAULT_CHUNK_ELEMS)
    if names is None:
        names = [n for n in tensor_order(base) if base.tensors[n].dtype in FLOAT_CODES]
    spans = [s for n in names for s in row_spans(n, base.tensors[n].shape, chunk_elems)]
    per_elem = {n: sum(ITEMSIZE[c.tensors[n].dtype] for c in [base, *agents] if n in c.tensors) for n in names}
    if tracker is None:
        tracker = ProgressTracker(phase, sum(s.numel * per_elem[s.tensor] for s in spans), len(names), progress)
    last_of = {n: row_spans(n, base.tensors[n].shape, chunk_elems)[-1].start for n in names}
    dtype = prepare_kernels(device, kernels, [base, *agents]) if kernels else "f32"
    lanes = Lanes(device)
    own_reader = reader is None
    reader = open_reader(base, agents, fingerprinter, lanes, read_threads) if own_reader else reader
    try:
        for span, data in reader.stream((s, s) for s in spans):
            try:
                if cancel is not None and cancel.is_set():
                    raise MergeCancelled()
                last = span.start == last_of[span.tensor]
                fused = bool(kernels) and fused_now(device, kernels, dtype, first=span is spans[0])
                chunk, uploaded = build_inputs(data, lanes, fused)
                yield data, chunk, last, fused
            finally:
                data.release(uploaded)
            tracker.advance(span.numel * per_elem[span.tensor], span.tensor, tensor_finished=last)
    finally:
        if own_reader:
            reader.close()
    tracker.advance(0, "", force=True)


def check_finite(data: ChunkData, peak: torch.Tensor, labels: list[str], base_label: str) -> torch.Tensor:
    """Pass through the per-agent max |τ|; a NaN/Inf anywhere in the inputs stops the run with its location."""
    if bool(torch.isfinite(peak).all()):
        return peak
    raise nonfinite_input(data, labels, base_label) or overflow_error(data.span.tensor)


def nonfinite_input(data: ChunkData, labels: list[str], base_label: str) -> RamStudioError | None:
    """The error naming the first NaN/Inf in the chunk's inputs, or None when they are all finite."""
    span = data.span
    for label, t in [(base_label, data.base)] + list(zip(labels, data.agents)):
        if t is None:
            continue
        bad = ~torch.isfinite(t.float().reshape(-1))
        if bool(bad.any()):
            idx = span.offset + int(bad.nonzero()[0])
            return RamStudioError(
                f"tensor {span.tensor!r} of {label} holds NaN or Inf (first at flat index {idx:,}).",
                "Merging would spread it; repair or re-download that checkpoint.")
    return None


def overflow_error(tensor: str) -> RamStudioError:
    return RamStudioError(f"task vectors of tensor {tensor!r} overflow float32.", "Check the inputs.")


def locate_nonfinite(base: Checkpoint, agents: list[Checkpoint], device: torch.device,
                     chunk_elems: int = DEFAULT_CHUNK_ELEMS, read_threads: int | None = None) -> None:
    """Raise the error that names the first NaN/Inf among the inputs (or the tensor whose task vectors
    overflow): the second look a pass takes when its deferred finite check failed (error path only)."""
    labels = [a.label for a in agents]
    for data, chunk, _last, fused in float_chunks(base, agents, phase="check", device=device,
                                                  chunk_elems=chunk_elems, read_threads=read_threads,
                                                  kernels=("peak_abs_tau",)):
        if chunk.numel:
            check_finite(data, chunk.peak_abs_tau(fused).cpu(), labels, base.label)
    raise RamStudioError("the task vectors are not finite.", "Check the inputs.")

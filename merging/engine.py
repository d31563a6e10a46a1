"""The streaming merge engine: read aligned chunks, compute τ_m in float32 on the device, write the output.

Reading (a prefetch thread), compute (this thread) and writing (a writer thread) overlap. Memory is
bounded by the chunk size: at most a few chunks of (1 + N) models are alive at once.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from .checkpoint import Checkpoint
from .dtypes import FLOAT_CODES, ITEMSIZE, ST_TO_TORCH
from .errors import MergeCancelled, RamStudioError
from .fingerprint import Fingerprinter
from .kernels import kernels_enabled
from .methods.base import MergeMethod
from .output_check import OutputGuard
from .stream import DEFAULT_CHUNK_ELEMS, AlignedReader, BackgroundWriter, ChunkData, prefetch, row_spans
from .tensor_merge import ChunkInputs, TensorMerger
from .writer import PlannedTensor, ShardSetWriter


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

    def advance(self, nbytes: int, tensor: str, tensor_finished: bool = False, force: bool = False) -> None:
        self.done += nbytes
        self.tensors_done += int(tensor_finished)
        now = time.perf_counter()
        if self.callback and (force or now - self._last >= self.interval):
            self._last = now
            self.callback(Progress(self.phase, self.done, self.total, self.tensors_done, self.tensors_total,
                                   tensor, now - self.start))


def tensor_order(base: Checkpoint) -> list[str]:
    """Base tensors in on-disk order (file, offset): sequential reads, and a stable output order."""
    return sorted(base.tensors, key=lambda n: (base.tensors[n].file.name, base.tensors[n].begin))


def build_inputs(data: ChunkData, device: torch.device, fused: bool) -> ChunkInputs:
    """The chunk, converted to float32 on `device` lazily (the fused kernels read the stored values)."""
    return ChunkInputs(data.base, data.agents, device, keep_agents=fused)


def uses_kernels(device: torch.device) -> bool:
    """Whether work on `device` goes through the fused CPU kernels."""
    return device.type == "cpu" and kernels_enabled()


def float_chunks(base: Checkpoint, agents: list[Checkpoint], *, phase: str, device: torch.device,
                 chunk_elems: int = DEFAULT_CHUNK_ELEMS, progress: ProgressFn | None = None,
                 cancel: threading.Event | None = None, fingerprinter: Fingerprinter | None = None
                 ) -> Iterator[tuple[ChunkData, ChunkInputs, bool]]:
    """Every float tensor of the base, chunk by chunk and aligned with the agents, read ahead on a thread:
    (stored data, its ChunkInputs, whether it is the tensor's last chunk). The single-pass readers (the
    counting pass, the analysis) share this; progress is reported in bytes of input."""
    names = [n for n in tensor_order(base) if base.tensors[n].dtype in FLOAT_CODES]
    spans = [s for n in names for s in row_spans(n, base.tensors[n].shape, chunk_elems)]
    per_elem = {n: sum(ITEMSIZE[c.tensors[n].dtype] for c in [base, *agents] if n in c.tensors) for n in names}
    tracker = ProgressTracker(phase, sum(s.numel * per_elem[s.tensor] for s in spans), len(names), progress)
    last_of = {n: row_spans(n, base.tensors[n].shape, chunk_elems)[-1].start for n in names}
    fused = uses_kernels(device)
    reader = AlignedReader(base, agents, fingerprinter)
    try:
        for data in prefetch(reader.read(s) for s in spans):
            if cancel is not None and cancel.is_set():
                raise MergeCancelled()
            span = data.span
            last = span.start == last_of[span.tensor]
            yield data, build_inputs(data, device, fused), last
            tracker.advance(span.numel * per_elem[span.tensor], span.tensor, tensor_finished=last)
    finally:
        reader.release()
    tracker.advance(0, "", force=True)


def check_finite(data: ChunkData, peak: torch.Tensor, labels: list[str], base_label: str) -> torch.Tensor:
    """Pass through the per-agent max |τ|; a NaN/Inf anywhere in the inputs stops the run with its location."""
    if bool(torch.isfinite(peak).all()):
        return peak
    span = data.span
    for label, t in [(base_label, data.base)] + list(zip(labels, data.agents)):
        if t is None:
            continue
        bad = ~torch.isfinite(t.float().reshape(-1))
        if bool(bad.any()):
            idx = span.offset + int(bad.nonzero()[0])
            raise RamStudioError(
                f"tensor {span.tensor!r} of {label} holds NaN or Inf (first at flat index {idx:,}).",
                "Merging would spread it; repair or re-download that checkpoint.")
    raise RamStudioError(f"task vectors of tensor {span.tensor!r} overflow float32.", "Check the inputs.")


@dataclass
class EngineResult:
    """Each agent's max |τ| over the model (0 means it equals the base), and whether any output value
    differs from the base's."""

    max_abs_tau: list[float]
    changed: bool


def output_plan(base: Checkpoint, out_dtype: str | None) -> list[PlannedTensor]:
    """What the merged model holds: the base's tensors, float ones in the output dtype."""
    plan = []
    for name in tensor_order(base):
        e = base.tensors[name]
        dtype = out_dtype if (out_dtype and e.dtype in FLOAT_CODES) else e.dtype
        plan.append(PlannedTensor(name, dtype, e.shape))
    return plan


def _work(reader: AlignedReader, base: Checkpoint, rounds: int, chunk_elems: int,
          cancel: threading.Event | None) -> Iterator[tuple[int, bool, ChunkData]]:
    """Yield (round, last_span_of_round, chunk) for every tensor: each pass round, then the merge round."""
    for name in tensor_order(base):
        e = base.tensors[name]
        spans = row_spans(name, e.shape, chunk_elems)
        n_rounds = rounds if e.dtype in FLOAT_CODES else 1
        if len(spans) == 1:
            data = reader.read(spans[0])  # one read serves every round of a one-chunk tensor
            for r in range(n_rounds):
                yield r, True, data
            continue
        for r in range(n_rounds):
            for i, span in enumerate(spans):
                if cancel is not None and cancel.is_set():
                    return
                yield r, i == len(spans) - 1, reader.read(span)


def stream_merge(base: Checkpoint, agents: list[Checkpoint], method: MergeMethod, params: dict[str, Any],
                 shared: dict[str, Any], sink: ShardSetWriter, *, out_dtype: str | None, device: torch.device,
                 chunk_elems: int = DEFAULT_CHUNK_ELEMS, agent_keys: tuple[str, ...] | None = None,
                 progress: ProgressFn | None = None, cancel: threading.Event | None = None,
                 fingerprinter: Fingerprinter | None = None) -> EngineResult:
    """Merge every tensor of `base` with `agents` into `sink`; raises MergeCancelled when `cancel` is set.

    Every output chunk is checked (finite, and whether it differs from the base) before it is written."""
    labels = [a.label for a in agents]
    keys = agent_keys or tuple(labels)
    rounds = len(method.passes(params)) + 1
    fused = uses_kernels(device)
    reader = AlignedReader(base, agents, fingerprinter)
    blame = ", ".join(f"{p.name}={params[p.name]:g}" for p in method.params if p.float32)
    guard = OutputGuard(", ".join(x for x in (blame, f"output dtype {out_dtype}" if out_dtype else "") if x)
                        or "none")
    # Bytes of input behind one element of each tensor (base + agents), for progress in bytes.
    per_elem = {n: sum(ITEMSIZE[c.tensors[n].dtype] for c in [base, *agents] if n in c.tensors)
                for n in base.tensors}
    total = sum(e.numel * per_elem[n] * (rounds if e.dtype in FLOAT_CODES else 1) for n, e in base.tensors.items())
    tracker = ProgressTracker("merge", total, len(base.tensors), progress)
    writer = BackgroundWriter()
    peaks = torch.zeros(len(agents), dtype=torch.float64)
    merger: TensorMerger | None = None
    cached: tuple[ChunkData, ChunkInputs] | None = None
    try:
        for r, last, data in prefetch(_work(reader, base, rounds, chunk_elems, cancel)):
            if cancel is not None and cancel.is_set():
                raise MergeCancelled()
            span = data.span
            entry = base.tensors[span.tensor]
            step = span.numel * per_elem[span.tensor]
            if entry.dtype not in FLOAT_CODES:
                _check_equal_non_float(data, labels)
                out, checked = data.base, None
            else:
                if merger is None or merger.ctx.tensor != span.tensor:
                    merger = TensorMerger(method, params, span.tensor, entry.numel, keys, shared, fused=fused)
                    cached = None
                if cached is not None and cached[0] is data:
                    chunk = cached[1]  # a one-chunk tensor: converted once for all its rounds
                else:
                    chunk = build_inputs(data, device, fused)
                    cached = (data, chunk)
                if r < rounds - 1:
                    merger.reduce(r, span.offset, chunk)
                    if last:
                        merger.finish_round(r)
                    tracker.advance(step, span.tensor)
                    continue
                merged, peak = merger.merge(span.offset, chunk)
                peaks = torch.maximum(peaks, check_finite(data, peak, labels, base.label).double().cpu())
                target = ST_TO_TORCH[out_dtype] if out_dtype else data.base.dtype
                out, checked = merged.to(target).cpu(), guard
            _submit(writer, sink, span, out, data.base, checked)
            tracker.advance(step, span.tensor, tensor_finished=last)
        writer.close()
    except BaseException:
        try:
            writer.close()
        except BaseException:
            pass
        sink.abort()
        raise
    finally:
        reader.release()
    tracker.advance(0, "", force=True)
    return EngineResult(peaks.tolist(), guard.changed)


def _submit(writer: BackgroundWriter, sink: ShardSetWriter, span: Any, out: torch.Tensor, base: torch.Tensor,
            guard: OutputGuard | None) -> None:
    """Queue one output chunk: check it (when `guard` is given), then write its bytes (starting the
    tensor on its first span)."""
    flat = out.contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy() if flat.numel() else b""
    first = span.start == 0

    def job() -> None:
        if guard is not None:
            guard.check(span.tensor, span.offset, flat, base)
        if first:
            sink.begin(span.tensor)
        sink.write(data)

    writer.submit(job)


def _check_equal_non_float(data: ChunkData, labels: list[str]) -> None:
    """Integer/bool tensors (buffers, ids) are copied from the base; agents must hold the same values."""
    for label, a in zip(labels, data.agents):
        if a is not None and not torch.equal(a, data.base):
            raise RamStudioError(
                f"non-float tensor {data.span.tensor!r} differs between the base and {label}.",
                "Integer or boolean tensors cannot be merged; the models must share them.")

"""The streaming merge loop: every tensor of the base, read in aligned chunks, merged in float32 on the
compute device, checked and written at its offset.

Each tensor takes one of four paths (`TensorPath`): non-float tensors are copied from the base; methods with
passes on a GPU merge a whole tensor on the device; otherwise a tensor is merged chunk by chunk, through the
fused CPU kernels once they are ready, else through the method's torch function (both give the same bits).
Reading (reader threads), compute (this thread) and writing (writer threads) overlap. Memory is bounded by
the chunk size: at most a few chunks of (1 + N) models are alive at once.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Iterator

import torch

from merging.common.device import Lanes, chunk_elems_for, fits_on_device, gpu_style
from merging.common.dtypes import FLOAT_CODES, ITEMSIZE, ST_TO_TORCH
from merging.common.errors import MergeCancelled
from merging.engine.output import (
    Peaks,
    check_equal_non_float,
    emit_from_device,
    raise_nonfinite,
    submit_host,
    take_buffer,
)
from merging.engine.precision import PrecisionProbe
from merging.engine.tensor_merge import TensorMerger
from merging.methods.base import MergeMethod
from merging.passes import (
    GUARD_KERNELS,
    ProgressFn,
    ProgressTracker,
    build_inputs,
    check_finite,
    fused_now,
    open_reader,
    prepare_kernels,
    uses_kernels,
)
from merging.reading.checkpoint import Checkpoint, tensor_order
from merging.reading.chunk_inputs import ChunkInputs
from merging.reading.chunks import DEFAULT_CHUNK_ELEMS, BufferPool, ChunkData, Span, row_spans
from merging.reading.fingerprint import Fingerprinter
from merging.writing.background import BackgroundWriter
from merging.writing.output_check import OutputGuard
from merging.writing.shards import PlannedTensor, ShardSetWriter


@dataclass
class EngineResult:
    """Each agent's max |τ| over the model (0 means it equals the base), and whether any output value
    differs from the base's."""

    max_abs_tau: list[float]
    changed: bool
    beyond_rounding: bool = True  # some value differs from the base's by more than one step of its dtype
    precision: list[str] = field(default_factory=list)  # per agent stored finer than the output (engine/precision.py)


def output_plan(base: Checkpoint, out_dtype: str | None) -> list[PlannedTensor]:
    """What the merged model holds: the base's tensors, float ones in the output dtype."""
    plan = []
    for name in tensor_order(base):
        e = base.tensors[name]
        dtype = out_dtype if (out_dtype and e.dtype in FLOAT_CODES) else e.dtype
        plan.append(PlannedTensor(name, dtype, e.shape))
    return plan


class TensorPath(Enum):
    """How one tensor is merged (the engine's four paths)."""

    COPY = "non-float copy"  # integer/bool tensors: the base's values (agents must hold the same)
    WHOLE_ON_DEVICE = "whole tensor on the device"  # methods with passes on a GPU: read once, every round there
    CHUNKED_FUSED = "chunked, fused CPU kernels"
    CHUNKED_TORCH = "chunked, torch"  # any GPU, or the CPU until the kernels are ready


@dataclass(frozen=True)
class Step:
    """One chunk of one round: pass rounds first, then the merge round (the last)."""

    round: int
    last: bool  # the tensor's last span in this round
    span: Span
    path: TensorPath  # chunked steps are planned CHUNKED_TORCH and run fused once the kernels are ready
    keep: bool = False  # a one-chunk tensor read once for all its rounds: keep its data for a later round


def plan_steps(base: Checkpoint, rounds: int, chunk_elems: int, whole_on_device: Callable[[str], bool]
               ) -> Iterator[tuple[Span | None, Step]]:
    """(span to read, or None to reuse the one held, and its Step) for every tensor in on-disk order."""
    for name in tensor_order(base):
        e = base.tensors[name]
        spans = row_spans(name, e.shape, chunk_elems)
        if e.dtype not in FLOAT_CODES:
            for i, span in enumerate(spans):
                yield span, Step(0, i == len(spans) - 1, span, TensorPath.COPY)
        elif rounds > 1 and len(spans) > 1 and whole_on_device(name):
            for i, span in enumerate(spans):
                yield span, Step(0, i == len(spans) - 1, span, TensorPath.WHOLE_ON_DEVICE)
        elif len(spans) == 1:
            for r in range(rounds):
                yield (spans[0] if r == 0 else None), Step(r, True, spans[0], TensorPath.CHUNKED_TORCH,
                                                           keep=r < rounds - 1)
        else:
            for r in range(rounds):
                for i, span in enumerate(spans):
                    yield span, Step(r, i == len(spans) - 1, span, TensorPath.CHUNKED_TORCH)


def stream_merge(base: Checkpoint, agents: list[Checkpoint], method: MergeMethod, params: dict[str, Any],
                 shared: dict[str, Any], sink: ShardSetWriter, *, out_dtype: str | None, device: torch.device,
                 chunk_elems: int = DEFAULT_CHUNK_ELEMS,
                 progress: ProgressFn | None = None, cancel: threading.Event | None = None,
                 fingerprinter: Fingerprinter | None = None, read_threads: int | None = None,
                 write_threads: int | None = None, reader: Any = None,
                 side: list[Checkpoint] | None = None) -> EngineResult:
    """Merge every tensor of `base` with `agents` into `sink`; raises MergeCancelled when `cancel` is set.

    Every output chunk is checked (finite, and whether it differs from the base) before it is written,
    at its offset, by the writer threads. A `reader` given (a sweep's merging.reading.resident.ResidentReader,
    built with the same chunk size) serves the inputs instead of the files, and is left open. `side` (one
    checkpoint per agent, checked by merging.reading.side_tensors) is read chunk by chunk next to the weights,
    on its own reader threads, for a method that declares `side_tensors`."""
    chunk_elems = chunk_elems_for(device, chunk_elems, DEFAULT_CHUNK_ELEMS)
    if (side is not None) != (method.side_tensors is not None):
        raise ValueError(f"{method.name}: side tensors are given exactly when the method reads them")
    own_reader = reader is None
    if own_reader:
        reader = open_reader(base, agents, fingerprinter, Lanes(device), read_threads)
    side_reader = None if side is None else open_reader(side[0], side[1:], None, Lanes(device), read_threads)
    run = _MergeRun(base, agents, method, params, shared, sink, out_dtype, device, chunk_elems, progress,
                    reader, write_threads)
    try:
        try:
            steps = plan_steps(base, run.rounds, chunk_elems, run.whole_on_device)
            for step, data, side_data in _with_side(reader, side_reader, steps):
                if cancel is not None and cancel.is_set():
                    raise MergeCancelled()
                run.step(step, data, side_data)
        finally:
            run.writer.close()
    except BaseException:
        sink.abort()
        raise
    finally:
        if own_reader:
            reader.close()
        if side_reader is not None:
            side_reader.close()
    run.tracker.advance(0, "", force=True)
    return EngineResult(run.peaks.values(), run.guard.changed, run.guard.beyond_rounding,
                        run.probe.notes() if run.probe else [])


def _with_side(reader: Any, side_reader: Any, steps: Iterator[tuple[Span | None, Step]]
               ) -> Iterator[tuple[Step, ChunkData | None, ChunkData | None]]:
    """(step, its inputs, its side tensors or None): the side files are read ahead on their own threads for the
    same spans as the weights (a side file holds only float tensors: nothing for a copied one)."""
    if side_reader is None:
        for step, data in reader.stream(steps):
            yield step, data, None
        return
    planned = list(steps)
    side_items = ((span if step.path is not TensorPath.COPY else None, step) for span, step in planned)
    for (step, data), (_, side_data) in zip(reader.stream(iter(planned)), side_reader.stream(side_items)):
        yield step, data, side_data


class _MergeRun:
    """The state of one streaming merge, and one method per path."""

    def __init__(self, base: Checkpoint, agents: list[Checkpoint], method: MergeMethod, params: dict[str, Any],
                 shared: dict[str, Any], sink: ShardSetWriter, out_dtype: str | None, device: torch.device,
                 chunk_elems: int, progress: ProgressFn | None, reader: Any, write_threads: int | None) -> None:
        self.base, self.agents, self.method, self.params, self.shared = base, agents, method, params, shared
        self.sink, self.out_dtype, self.device = sink, out_dtype, device
        self.chunk_elems, self.reader = chunk_elems, reader
        self.labels = [a.label for a in agents]
        self.rounds = len(method.passes(params)) + 1
        self.kernels = method.kernels
        self.kernel_dtype = prepare_kernels(device, self.kernels + GUARD_KERNELS, [base, *agents])
        self.kernels_on = uses_kernels(device) and bool(self.kernels)
        self.lanes = Lanes(device)
        self.out_pool = BufferPool(pinned=self.lanes.cuda, keep=6)
        blame = ", ".join(f"{p.name}={params[p.name]:g}" for p in method.params if p.float32)
        self.guard = OutputGuard(", ".join(x for x in (blame, f"output dtype {out_dtype}" if out_dtype else "") if x)
                                 or "none")
        # Bytes of input behind one element of each tensor (base + agents), for progress in bytes.
        self.per_elem = {n: sum(ITEMSIZE[c.tensors[n].dtype] for c in [base, *agents] if n in c.tensors)
                         for n in base.tensors}
        total = sum(e.numel * self.per_elem[n] * (self.rounds if e.dtype in FLOAT_CODES else 1)
                    for n, e in base.tensors.items())
        self.tracker = ProgressTracker("merge", total, len(base.tensors), progress)
        self.writer = BackgroundWriter(depth=3, threads=write_threads or 1)
        self.peaks = Peaks(len(agents))
        self.fused = False
        self.merger: TensorMerger | None = None
        self.held: tuple[ChunkData, ChunkInputs, Any] | None = None
        self.whole: torch.Tensor | None = None  # the tensor being assembled on the device, (1 + N, numel) float32
        probe = PrecisionProbe(base, agents, self.labels, out_dtype)
        self.probe = probe if probe.active else None

    def whole_on_device(self, name: str) -> bool:
        """Methods with passes on a GPU: each tensor read once, all its rounds there (when it fits)."""
        return gpu_style(self.device) and not uses_kernels(self.device) and fits_on_device(
            self.device, self.base.tensors[name].numel * (1 + len(self.agents)) * 4 * 6)

    def step(self, step: Step, data: ChunkData | None, side: ChunkData | None = None) -> None:
        if step.path is TensorPath.COPY:
            return self.copy_non_float(step, data)
        if self.probe is not None and data is not None and step.round == 0:
            self.probe.add(data)
        self._merger_for(step)
        if step.path is TensorPath.WHOLE_ON_DEVICE:
            return self.whole_tensor(step, data)
        self.chunked(step, data, side)

    def _merger_for(self, step: Step) -> None:
        """A TensorMerger per tensor, fused or torch. A merge without passes switches to the kernels at the
        first chunk after they are ready (the first tensor, the embeddings, can be ~15 % of the model)."""
        m, name = self.merger, step.span.tensor
        switch = self.rounds == 1 and not self.fused and self.kernels_on and fused_now(
            self.device, self.kernels, self.kernel_dtype)
        if m is None or m.ctx.tensor != name or switch:
            self.fused = self.kernels_on and fused_now(self.device, self.kernels, self.kernel_dtype,
                                                       first=m is None) and step.path is not TensorPath.WHOLE_ON_DEVICE
            self.merger = TensorMerger(self.method, self.params, name, self.base.tensors[name].numel,
                                       len(self.agents), self.shared, fused=self.fused)
            self.merger.ctx.dtype = self.base.tensors[name].dtype  # what a rule in steps counts in

    def _advance(self, step: Step, nbytes: int) -> None:
        self.tracker.advance(nbytes, step.span.tensor, tensor_finished=step.last)

    def copy_non_float(self, step: Step, data: ChunkData) -> None:
        """Path COPY: integer/bool tensors (buffers, ids) are written from the base."""
        check_equal_non_float(data, self.labels)
        submit_host(self.writer, self.sink, step.span, data.base, data, None, None)
        self._advance(step, step.span.numel * self.per_elem[step.span.tensor])

    def whole_tensor(self, step: Step, data: ChunkData) -> None:
        """Path WHOLE_ON_DEVICE: copy each chunk into one (1 + N, numel) tensor; at the last, run every round."""
        span, entry = step.span, self.base.tensors[step.span.tensor]
        chunk, uploaded = build_inputs(data, self.lanes, False)
        if span.start == 0:
            self.whole = torch.empty((1 + len(self.agents), entry.numel), dtype=torch.float32, device=self.device)
        assert self.whole is not None
        self.whole[:, span.offset:span.offset + span.numel].copy_(chunk.models)
        data.release(uploaded)
        del chunk
        self._advance(step, span.numel * self.per_elem[span.tensor] * self.rounds)
        if not step.last:
            return
        full = ChunkInputs.on_device(self.whole, keep_agents=False)
        self.whole = None
        for r in range(self.rounds - 1):
            self.merger.reduce(r, 0, full)
            self.merger.finish_round(r)
        merged, peak = self.merger.merge(0, full)
        tensor_spans = row_spans(span.tensor, entry.shape, self.chunk_elems)
        self._emit(merged, peak, full.base, Span(span.tensor, 0, entry.shape[0], 0, entry.numel),
                   lambda: raise_nonfinite(self.reader, tensor_spans, self.labels, self.base.label))

    def chunked(self, step: Step, data: ChunkData | None, side: ChunkData | None = None) -> None:
        """Paths CHUNKED_*: pass rounds reduce the chunk; the merge round merges it (fused or torch)."""
        if data is None:  # a one-chunk tensor: read and converted once for all its rounds
            assert self.held is not None
            data, chunk, uploaded = self.held
        else:
            chunk, uploaded = build_inputs(data, self.lanes, self.fused)
        self.held = (data, chunk, uploaded) if step.keep else None
        if step.round < self.rounds - 1:
            self.merger.reduce(step.round, step.span.offset, chunk)
            if step.last:
                self.merger.finish_round(step.round)
            if not step.keep:
                data.release(uploaded)
            self.tracker.advance(step.span.numel * self.per_elem[step.span.tensor], step.span.tensor)
            return
        if self.fused:
            self.merge_fused(step, data, chunk)
        else:
            self.merge_torch(step, data, chunk, uploaded, side)
        self._advance(step, step.span.numel * self.per_elem[step.span.tensor])

    def _target(self, span: Span) -> torch.dtype:
        return ST_TO_TORCH[self.out_dtype or self.base.tensors[span.tensor].dtype]

    def merge_fused(self, step: Step, data: ChunkData, chunk: ChunkInputs) -> None:
        """Path CHUNKED_FUSED: the kernel writes θ0 + τ_m into a pooled host buffer, checked and queued."""
        span, target, pool = step.span, self._target(step.span), self.out_pool
        out32 = take_buffer(pool, chunk.numel, torch.float32)
        merged, peak = self.merger.merge(span.offset, chunk, out=out32)
        peak = check_finite(data, peak, self.labels, self.base.label)
        self.peaks.add(peak)
        pooled = merged.numel() == 0 or merged.data_ptr() == out32.data_ptr()
        if target == torch.float32 and pooled:
            out = out32
        else:
            self.guard.check_range(span.tensor, span.offset, merged, target)  # F8_E4M3 saturates
            out = take_buffer(pool, chunk.numel, target).copy_(merged)
            pool.give(out32)
        self.guard.note_change(out, data.base, float(peak.max()) if peak.numel() else 0.0)
        data.release()  # the writer needs only the output
        submit_host(self.writer, self.sink, span, out, None, self.guard, pool)

    def merge_torch(self, step: Step, data: ChunkData, chunk: ChunkInputs, uploaded: Any,
                    side: ChunkData | None = None) -> None:
        """Path CHUNKED_TORCH: the method's torch function on the device; rounding and checks there too."""
        span = step.span
        side_f32 = None
        if side is not None:  # (N, E) float32 on the device, then the side file's buffer is free again
            rows = side.stage if side.stage is not None else torch.stack([side.base, *side.agents])
            side_f32 = rows.reshape(len(self.agents), -1).to(self.device, torch.float32, copy=True)
            side.release()
        merged, peak = self.merger.merge(span.offset, chunk, side=side_f32)
        base_f32 = chunk.base
        data.release(uploaded)  # the staging buffer is free once its copy to the device is done
        self._emit(merged, peak, base_f32, span,
                   lambda: raise_nonfinite(self.reader, [span], self.labels, self.base.label))

    def _emit(self, merged: torch.Tensor, peak: torch.Tensor, base_f32: torch.Tensor, span: Span,
              on_bad: Callable[[], None]) -> None:
        emit_from_device(self.writer, self.sink, self.lanes, merged, peak, base_f32, self._target(span), self.guard,
                         self.peaks, span, self.chunk_elems, on_bad, self.out_pool)

"""The streaming merge engine: read aligned chunks, compute τ_m in float32 on the device, write the output.

Reading (a prefetch thread), compute (this thread) and writing (a writer thread) overlap. Memory is
bounded by the chunk size: at most a few chunks of (1 + N) models are alive at once.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from merging.reading.checkpoint import Checkpoint
from merging.common.dtypes import FLOAT_CODES, ITEMSIZE, ST_TO_TORCH
from merging.common.errors import MergeCancelled, RamStudioError
from merging.reading.fingerprint import Fingerprinter
from merging.methods.base import MergeMethod
from merging.writing.output_check import N_FLAGS, OutputGuard
from merging.common.device import Lanes, chunk_elems_for, fits_on_device, gpu_style
from merging.reading.chunks import DEFAULT_CHUNK_ELEMS, BufferPool, ChunkData, ChunkReader, Span, row_spans
from merging.writing.background import BackgroundWriter
from merging.reading.chunk_inputs import ChunkInputs
from merging.engine.tensor_merge import TensorMerger
from merging.passes import (GUARD_KERNELS, ProgressFn, ProgressTracker, build_inputs, check_finite, fused_now,
                            nonfinite_input, open_reader, overflow_error, prepare_kernels, uses_kernels)
from merging.reading.checkpoint import tensor_order
from merging.writing.shards import PlannedTensor, ShardSetWriter


@dataclass
class EngineResult:
    """Each agent's max |τ| over the model (0 means it equals the base), and whether any output value
    differs from the base's."""

    max_abs_tau: list[float]
    changed: bool
    beyond_rounding: bool = True  # some value differs from the base's by more than one step of its dtype


def output_plan(base: Checkpoint, out_dtype: str | None) -> list[PlannedTensor]:
    """What the merged model holds: the base's tensors, float ones in the output dtype."""
    plan = []
    for name in tensor_order(base):
        e = base.tensors[name]
        dtype = out_dtype if (out_dtype and e.dtype in FLOAT_CODES) else e.dtype
        plan.append(PlannedTensor(name, dtype, e.shape))
    return plan


def _work(base: Checkpoint, rounds: int, chunk_elems: int, assemble: Callable[[str], bool]
          ) -> Iterator[tuple[Span | None, tuple[int, bool, Span, Any]]]:
    """(span to read or None to reuse the last one, (round, last span of the round, span, mode)) for every
    tensor: each pass round, then the merge round. A one-chunk tensor is read once for all its rounds
    (mode True: the data must be kept for a later round); a tensor to `assemble` is read once, chunk by
    chunk, into one tensor on the device (mode "assemble"), where all its rounds run."""
    for name in tensor_order(base):
        e = base.tensors[name]
        spans = row_spans(name, e.shape, chunk_elems)
        n_rounds = rounds if e.dtype in FLOAT_CODES else 1
        if n_rounds > 1 and len(spans) > 1 and assemble(name):
            for i, span in enumerate(spans):
                yield span, (0, i == len(spans) - 1, span, "assemble")
            continue
        if len(spans) == 1:
            for r in range(n_rounds):
                yield (spans[0] if r == 0 else None), (r, True, spans[0], r < n_rounds - 1)
            continue
        for r in range(n_rounds):
            for i, span in enumerate(spans):
                yield span, (r, i == len(spans) - 1, span, False)


def stream_merge(base: Checkpoint, agents: list[Checkpoint], method: MergeMethod, params: dict[str, Any],
                 shared: dict[str, Any], sink: ShardSetWriter, *, out_dtype: str | None, device: torch.device,
                 chunk_elems: int = DEFAULT_CHUNK_ELEMS,
                 progress: ProgressFn | None = None, cancel: threading.Event | None = None,
                 fingerprinter: Fingerprinter | None = None, read_threads: int | None = None,
                 write_threads: int | None = None, reader: Any = None) -> EngineResult:
    """Merge every tensor of `base` with `agents` into `sink`; raises MergeCancelled when `cancel` is set.

    Every output chunk is checked (finite, and whether it differs from the base) before it is written,
    at its offset, by the writer threads. A `reader` given (a sweep's merging.reading.resident.ResidentReader, built
    with the same chunk size) serves the inputs instead of the files, and is left open."""
    chunk_elems = chunk_elems_for(device, chunk_elems, DEFAULT_CHUNK_ELEMS)
    labels = [a.label for a in agents]
    rounds = len(method.passes(params)) + 1
    wanted = method.kernels
    dtype = prepare_kernels(device, wanted + GUARD_KERNELS, [base, *agents])
    fused = False
    kernels_on = uses_kernels(device)
    lanes = Lanes(device)
    own_reader = reader is None
    reader = open_reader(base, agents, fingerprinter, lanes, read_threads) if own_reader else reader
    out_pool = BufferPool(pinned=lanes.cuda, keep=6)
    blame = ", ".join(f"{p.name}={params[p.name]:g}" for p in method.params if p.float32)
    guard = OutputGuard(", ".join(x for x in (blame, f"output dtype {out_dtype}" if out_dtype else "") if x)
                        or "none")
    # Bytes of input behind one element of each tensor (base + agents), for progress in bytes.
    per_elem = {n: sum(ITEMSIZE[c.tensors[n].dtype] for c in [base, *agents] if n in c.tensors)
                for n in base.tensors}
    total = sum(e.numel * per_elem[n] * (rounds if e.dtype in FLOAT_CODES else 1) for n, e in base.tensors.items())
    tracker = ProgressTracker("merge", total, len(base.tensors), progress)
    writer = BackgroundWriter(depth=3, threads=write_threads or 1)
    peaks = _Peaks(len(agents))
    merger: TensorMerger | None = None
    held: tuple[ChunkData, ChunkInputs, Any] | None = None
    whole: torch.Tensor | None = None  # the tensor being assembled on the device, (1 + N, numel) float32

    def assemble(name: str) -> bool:  # methods with passes on a GPU: each tensor read once, all rounds there
        return gpu_style(device) and not uses_kernels(device) and fits_on_device(
            device, base.tensors[name].numel * (1 + len(agents)) * 4 * 6)

    def emit(merged: torch.Tensor, peak: torch.Tensor, base_f32: torch.Tensor, span: Span, target: torch.dtype,
             on_bad: Callable[[], None]) -> None:
        _emit_from_device(writer, sink, lanes, merged, peak, base_f32, target, guard, peaks, span, chunk_elems,
                          on_bad, out_pool)

    try:
        try:
            for (r, last, span, keep), data in reader.stream(_work(base, rounds, chunk_elems, assemble)):
                if cancel is not None and cancel.is_set():
                    raise MergeCancelled()
                entry = base.tensors[span.tensor]
                step = span.numel * per_elem[span.tensor]
                if entry.dtype not in FLOAT_CODES:
                    _check_equal_non_float(data, labels)
                    _submit_host(writer, sink, span, data.base, data, None, None)
                    tracker.advance(step, span.tensor, tensor_finished=last)
                    continue
                target = ST_TO_TORCH[out_dtype or entry.dtype]  # this tensor's output dtype
                # Kernels or torch: per tensor; a merge without passes switches to the kernels at the
                # first chunk after they are ready (the first tensor, the embeddings, can be ~15 % of it).
                if merger is None or merger.ctx.tensor != span.tensor or (rounds == 1 and not fused and kernels_on
                                                                          and fused_now(device, wanted, dtype)):
                    fused = fused_now(device, wanted, dtype, first=merger is None) and keep != "assemble"
                    merger = TensorMerger(method, params, span.tensor, entry.numel, len(agents), shared, fused=fused)
                if keep == "assemble":
                    chunk, uploaded = build_inputs(data, lanes, False)
                    if span.start == 0:
                        whole = torch.empty((1 + len(agents), entry.numel), dtype=torch.float32, device=device)
                    assert whole is not None
                    whole[:, span.offset:span.offset + span.numel].copy_(chunk.models)
                    data.release(uploaded)
                    del chunk
                    tracker.advance(step * rounds, span.tensor, tensor_finished=last)
                    if last:
                        full = ChunkInputs.on_device(whole, keep_agents=False)
                        whole = None
                        for rr in range(rounds - 1):
                            merger.reduce(rr, 0, full)
                            merger.finish_round(rr)
                        merged, peak = merger.merge(0, full)
                        tensor_spans = row_spans(span.tensor, entry.shape, chunk_elems)
                        emit(merged, peak, full.base, Span(span.tensor, 0, entry.shape[0], 0, entry.numel), target,
                             lambda ts=tensor_spans: _raise_nonfinite(reader, ts, labels, base.label))
                        del full, merged
                    continue
                if data is None:  # a one-chunk tensor: read and converted once for all its rounds
                    assert held is not None
                    data, chunk, uploaded = held
                else:
                    chunk, uploaded = build_inputs(data, lanes, fused)
                held = (data, chunk, uploaded) if keep else None
                if r < rounds - 1:
                    merger.reduce(r, span.offset, chunk)
                    if last:
                        merger.finish_round(r)
                    if not keep:
                        data.release(uploaded)
                    tracker.advance(step, span.tensor)
                    continue
                if fused:
                    out32 = _take(out_pool, chunk.numel, torch.float32)
                    merged, peak = merger.merge(span.offset, chunk, out=out32)
                    peak = check_finite(data, peak, labels, base.label)
                    peaks.add(peak)
                    pooled = merged.numel() == 0 or merged.data_ptr() == out32.data_ptr()
                    if target == torch.float32 and pooled:
                        out = out32
                    else:
                        guard.check_range(span.tensor, span.offset, merged, target)  # F8_E4M3 saturates
                        out = _take(out_pool, chunk.numel, target).copy_(merged)
                        out_pool.give(out32)
                    guard.note_change(out, data.base, float(peak.max()) if peak.numel() else 0.0)
                    data.release()  # the writer needs only the output
                    _submit_host(writer, sink, span, out, None, guard, out_pool)
                else:
                    merged, peak = merger.merge(span.offset, chunk)
                    base_f32 = chunk.base
                    data.release(uploaded)  # the staging buffer is free once its copy to the device is done
                    emit(merged, peak, base_f32, span, target,
                         lambda sp=span: _raise_nonfinite(reader, [sp], labels, base.label))
                    del merged, base_f32, chunk
                tracker.advance(step, span.tensor, tensor_finished=last)
        finally:
            writer.close()
    except BaseException:
        sink.abort()
        raise
    finally:
        if own_reader:
            reader.close()
    tracker.advance(0, "", force=True)
    return EngineResult(peaks.values(), guard.changed, guard.beyond_rounding)


class _Peaks:
    """Each agent's running max |τ| (float64), added to from the compute or the writer threads."""

    def __init__(self, n: int) -> None:
        self._peaks = torch.zeros(n, dtype=torch.float64)
        self._lock = threading.Lock()

    def add(self, peak: torch.Tensor) -> None:
        with self._lock:
            self._peaks = torch.maximum(self._peaks, peak.double().cpu())

    def values(self) -> list[float]:
        return self._peaks.tolist()


def _take(pool: BufferPool, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A (numel,) tensor of `dtype` on a pooled buffer (give it back with pool.give(t))."""
    size = numel * torch.empty((), dtype=dtype).element_size()
    return pool.take(size)[:size].view(dtype)


def _submit_host(writer: BackgroundWriter, sink: ShardSetWriter, span: Span, out: torch.Tensor,
                 data: ChunkData | None, guard: OutputGuard | None, pool: BufferPool | None) -> None:
    """Queue one output chunk that is on the host: check it is finite (when `guard` is given), write its
    bytes at their offset, then hand back the output buffer (to `pool`) and the input staging buffer."""
    flat = out.contiguous().reshape(-1)
    offset = span.offset * flat.element_size()

    def job() -> None:
        try:
            if guard is not None:
                guard.check_finite(span.tensor, span.offset, flat)
            if flat.numel():
                sink.write_at(span.tensor, offset, flat.view(torch.uint8).numpy())
        finally:
            if pool is not None:
                pool.give(out)
            if data is not None:
                data.release()

    writer.submit(job)


def _check_equal_non_float(data: ChunkData, labels: list[str]) -> None:
    """Integer/bool tensors (buffers, ids) are copied from the base; agents must hold the same values."""
    for label, a in zip(labels, data.agents):
        if a is not None and not torch.equal(a, data.base):
            raise RamStudioError(
                f"non-float tensor {data.span.tensor!r} differs between the base and {label}.",
                "Integer or boolean tensors cannot be merged; the models must share them.")


def _emit_from_device(writer: BackgroundWriter, sink: ShardSetWriter, lanes: Lanes, merged: torch.Tensor,
                      peak: torch.Tensor, base_f32: torch.Tensor, target: torch.dtype, guard: OutputGuard,
                      peaks: _Peaks, span: Span, piece_elems: int, on_bad: Callable[[], None],
                      pool: BufferPool) -> None:
    """The torch path's output (any GPU; the CPU without kernels): round to the output dtype and check on
    the device, copy to the host on the copy-out lane in pieces of at most `piece_elems` (host memory
    stays bounded even for a whole tensor), and queue the writes. Nothing here waits for the device:
    each writer job waits for its own copy, then checks the flags (inputs finite, output finite,
    changed) and writes its piece at its offset."""
    guard.check_range(span.tensor, span.offset, merged, target)  # F8_E4M3 saturates instead of overflowing
    out = merged.reshape(-1).to(target)
    flags = guard.flags(out, base_f32.reshape(-1).to(target), peak.max() if peak.numel() else 0.0)
    small = torch.cat([flags.to(peak.dtype), peak])  # one small copy: flags, then each agent's max |τ|
    host_small, small_done = lanes.download(small)
    first = [True]
    for a in range(0, max(out.numel(), 1), max(1, piece_elems)):
        b = min(a + piece_elems, out.numel())
        host = _take(pool, b - a, target) if lanes.cuda else None
        host_out, done = lanes.download(out[a:b], host)

        def job(a: int = a, host_out: torch.Tensor = host_out, done: Any = done, host: Any = host) -> None:
            try:
                lanes.wait(small_done)
                peak_host = host_small[N_FLAGS:]
                if not bool(torch.isfinite(peak_host).all()):
                    on_bad()  # raises, naming where
                if first[0]:
                    first[0] = False
                    peaks.add(peak_host)
                lanes.wait(done)
                guard.check_flags(span.tensor, span.offset + a, host_small[:N_FLAGS] != 0, host_out)
                if host_out.numel():
                    sink.write_at(span.tensor, (span.offset + a) * host_out.element_size(),
                                  host_out.contiguous().view(torch.uint8).numpy())
            finally:
                if host is not None:
                    pool.give(host)

        writer.submit(job)


def _raise_nonfinite(reader: ChunkReader, spans: list[Span], labels: list[str], base_label: str) -> None:
    """Re-read `spans` and raise the error naming the first NaN/Inf input (or the overflow)."""
    for sp in spans:
        data = reader.read(sp)
        try:
            err = nonfinite_input(data, labels, base_label)
        finally:
            data.release()
        if err is not None:
            raise err
    raise overflow_error(spans[0].tensor)

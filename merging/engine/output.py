"""From merged chunks to the writer: round to the output dtype, check, copy to the host, queue the writes."""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from merging.common.device import Lanes
from merging.common.errors import RamStudioError
from merging.passes import nonfinite_input, overflow_error
from merging.reading.chunks import BufferPool, ChunkData, ChunkReader, Span
from merging.writing.background import BackgroundWriter
from merging.writing.output_check import N_FLAGS, OutputGuard
from merging.writing.shards import ShardSetWriter


class Peaks:
    """Each agent's running max |τ| (float64), added to from the compute or the writer threads."""

    def __init__(self, n: int) -> None:
        self._peaks = torch.zeros(n, dtype=torch.float64)
        self._lock = threading.Lock()

    def add(self, peak: torch.Tensor) -> None:
        with self._lock:
            self._peaks = torch.maximum(self._peaks, peak.double().cpu())

    def values(self) -> list[float]:
        return self._peaks.tolist()


def take_buffer(pool: BufferPool, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A (numel,) tensor of `dtype` on a pooled buffer (give it back with pool.give(t))."""
    size = numel * torch.empty((), dtype=dtype).element_size()
    return pool.take(size)[:size].view(dtype)


def submit_host(writer: BackgroundWriter, sink: ShardSetWriter, span: Span, out: torch.Tensor,
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


def check_equal_non_float(data: ChunkData, labels: list[str]) -> None:
    """Integer/bool tensors (buffers, ids) are copied from the base; agents must hold the same values."""
    for label, a in zip(labels, data.agents):
        if a is not None and not torch.equal(a, data.base):
            raise RamStudioError(
                f"non-float tensor {data.span.tensor!r} differs between the base and {label}.",
                "Integer or boolean tensors cannot be merged; the models must share them.")


def emit_from_device(writer: BackgroundWriter, sink: ShardSetWriter, lanes: Lanes, merged: torch.Tensor,
                      peak: torch.Tensor, base_f32: torch.Tensor, target: torch.dtype, guard: OutputGuard,
                      peaks: Peaks, span: Span, piece_elems: int, on_bad: Callable[[], None],
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
        host = take_buffer(pool, b - a, target) if lanes.cuda else None
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


def raise_nonfinite(reader: ChunkReader, spans: list[Span], labels: list[str], base_label: str) -> None:
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

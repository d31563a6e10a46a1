"""Aligned, read-ahead reading of base and agent chunks by byte offset: the I/O stage shared by analysis
and merge, and the background writer.

safetensors gives every tensor's exact byte range, so a span's rows are read with `os.preadv` straight
into one staging buffer per chunk, (1 + N) rows of the stored dtype (base first), taken from a pool of
buffers that are reused (pinned when the compute device is a GPU): a freshly allocated buffer costs more
in page faults than the read itself, and reading a memory map faults every page. Several reader threads
fill chunks ahead of the consumer; each model is always read by the same thread, in order, so the
fingerprint of its bytes (merging/reading/fingerprint.py) is taken from the read itself.
"""
from __future__ import annotations

import math
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from merging.common.dtypes import ITEMSIZE, ST_TO_TORCH
from merging.common.errors import RamStudioError
from merging.reading.checkpoint import Checkpoint
from merging.reading.fingerprint import Fingerprinter
from merging.reading.mapped import MappedEntry
from merging.reading.safetensors_header import TensorEntry

DEFAULT_CHUNK_ELEMS = 1 << 23  # 8M elements: 32 MB per model in float32
READ_THREADS_ENV = "RAM_STUDIO_READ_THREADS"


def read_threads(models: int, requested: int | None = None) -> int:
    """Reader threads: `requested`, else $RAM_STUDIO_READ_THREADS, else one per model up to the cores."""
    if requested is None:
        env = os.environ.get(READ_THREADS_ENV, "").strip()
        requested = int(env) if env.isdigit() and int(env) > 0 else None
    if requested is None:
        requested = min(models, os.cpu_count() or 1)
    return max(1, min(int(requested), models))


@dataclass(frozen=True)
class Span:
    """Rows [start, stop) of one tensor; `offset` is the flat index of its first element."""

    tensor: str
    start: int
    stop: int
    offset: int
    numel: int


def row_spans(name: str, shape: tuple[int, ...], chunk_elems: int) -> list[Span]:
    """Split a tensor into whole-row spans of at most `chunk_elems` elements (at least one row each)."""
    if len(shape) == 0:
        return [Span(name, 0, 1, 0, 1)]
    row = math.prod(shape[1:])
    rows = shape[0]
    if rows == 0 or row == 0:
        return [Span(name, 0, rows, 0, 0)]
    per = max(1, chunk_elems // max(row, 1))
    return [Span(name, a, min(a + per, rows), a * row, (min(a + per, rows) - a) * row)
            for a in range(0, rows, per)]


class BufferPool:
    """Byte buffers that are handed out and given back, so that reads land in memory that is already
    mapped (and, for a GPU, pinned). At most `keep` idle buffers are kept; a buffer given back with a
    CUDA event is reused only once that event (the copy reading it) has completed."""

    def __init__(self, pinned: bool = False, keep: int = 8) -> None:
        self.pinned = pinned
        self.keep = keep
        self._free: deque[tuple[torch.Tensor, Any]] = deque()
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            best = -1
            for i, (buf, event) in enumerate(self._free):  # the smallest idle buffer that fits
                if buf.numel() >= nbytes and (best < 0 or buf.numel() < self._free[best][0].numel()) \
                        and (event is None or event.query()):
                    best = i
            if best >= 0:
                buf = self._free[best][0]
                del self._free[best]
                return buf
        # Round up so that slightly different chunk sizes share buffers.
        size = max(nbytes, 1 << 16)
        size = 1 << (size - 1).bit_length() if size < (1 << 24) else -(-size // (1 << 24)) * (1 << 24)
        return torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)

    def give(self, buf: torch.Tensor, event: Any = None) -> None:
        """Hand back a buffer from `take` (or any view of it: the whole buffer returns to the pool)."""
        buf = torch.empty(0, dtype=torch.uint8).set_(buf.untyped_storage())
        with self._lock:
            self._free.append((buf, event))
            while len(self._free) > self.keep:  # drop the smallest: large chunks are the common case
                i = min(range(len(self._free)), key=lambda k: self._free[k][0].numel())
                del self._free[i]


@dataclass
class ChunkData:
    """Stored-dtype data of one span: base and each agent (None where an agent counts as unchanged).

    `stage` is (1 + N, E) in one stored dtype (base first; an unchanged agent's row repeats the base)
    when every model stores the tensor alike, else None. `release()` hands the staging buffer back.
    `resident` data (merging/reading/resident.py) is kept for later merges: it must never be changed in place."""

    span: Span
    base: torch.Tensor
    agents: list[torch.Tensor | None]
    stage: torch.Tensor | None = None
    _slab: torch.Tensor | None = field(default=None, repr=False)
    _pool: BufferPool | None = field(default=None, repr=False)
    resident: bool = False

    def release(self, event: Any = None) -> None:
        """The buffer may be reused (after `event`, a CUDA event, when given); the tensors are invalid then."""
        if self._slab is not None and self._pool is not None:
            self._pool.give(self._slab, event)
        self._slab = None


class ShardFiles:
    """Read-only descriptors of the shard files, opened on first use and kept until `close`."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        self._data_start: dict[Path, int] = {}
        self._size: dict[Path, int] = {}
        self._lock = threading.Lock()

    def register(self, ckpt: Checkpoint) -> None:
        for h in ckpt.headers:
            # Tensors tile the data section exactly (checked with the header), so it starts here:
            self._data_start[h.path] = h.file_size - max((e.end for e in h.tensors.values()), default=0)
            self._size[h.path] = h.file_size

    def _fd(self, path: Path) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                try:
                    if os.fstat(fd).st_size != self._size[path]:
                        raise RamStudioError(f"{path} changed size since its header was read.",
                                             "Re-run once nothing writes to the inputs.")
                    if hasattr(os, "posix_fadvise"):
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                except BaseException:
                    os.close(fd)
                    raise
                self._fds[path] = fd
            return fd

    def read_into(self, entry: TensorEntry, byte_start: int, out: memoryview) -> None:
        """Fill `out` with the tensor's bytes from `byte_start` (relative to the tensor's first byte)."""
        if _TRACE_START[0]:
            _note_first_read()
        fd = self._fd(entry.file)
        pos = self._data_start[entry.file] + entry.begin + byte_start
        got, want = 0, out.nbytes
        while got < want:
            n = os.preadv(fd, [out[got:]], pos + got)
            if n <= 0:
                raise RamStudioError(f"{entry.file} ended before the data of tensor {entry.name!r}; it was "
                                     "truncated while it was being read.", "Re-download or re-export it.")
            got += n

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._fds.clear()


_TRACE_START = [bool(os.environ.get("RAM_STUDIO_TRACE_START"))]


def _note_first_read() -> None:
    """With $RAM_STUDIO_TRACE_START set, print once how long after the process started the first tensor
    byte is read (start-up: interpreter, imports, headers), for tests/benchmarks/run_benchmark.py."""
    _TRACE_START[0] = False
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            now = float(f.read().split()[0])
        import sys

        print(f"ram-studio: first tensor byte read {now - started:.2f} s after the process started",
              file=sys.stderr, flush=True)
    except (OSError, ValueError, IndexError):
        pass


def _rows_of(entry: TensorEntry) -> int:
    return entry.shape[0] if entry.shape else 1


def _row_bytes(entry: TensorEntry) -> int:
    return entry.nbytes // max(1, _rows_of(entry)) if entry.shape else entry.nbytes


class ChunkReader:
    """Reads the same rows from the base and every agent, padding what an agent lacks with base rows.

    `read(span)` reads on the calling thread; `stream(items)` reads ahead on `threads` reader threads
    (model m always on thread m mod threads). With a `fingerprinter`, every row read is also hashed.
    """

    def __init__(self, base: Checkpoint, agents: list[Checkpoint], fingerprinter: Fingerprinter | None = None,
                 *, threads: int | None = None, pool: BufferPool | None = None) -> None:
        self.base = base
        self.agents = agents
        self.models = [base, *agents]
        self.fingerprinter = fingerprinter
        self.threads = read_threads(len(self.models), threads)
        self.pool = pool or BufferPool()
        self.files = ShardFiles()
        for c in self.models:
            self.files.register(c)
        self._workers: list[ThreadPoolExecutor] = []

    # -- planning -------------------------------------------------------------------------------------
    def _plan(self, span: Span) -> tuple[str, list[tuple[int, TensorEntry, int, int] | None]]:
        """('stage' | 'mixed', per model: (model, entry, first row, stop row) or None for a missing agent)."""
        base_entry = self.base.tensors[span.tensor]
        parts: list[tuple[int, TensorEntry, int, int] | None] = [(0, base_entry, span.start, span.stop)]
        uniform = True
        for m, a in enumerate(self.agents, start=1):
            entry = a.tensors.get(span.tensor)
            if entry is None:
                parts.append(None)  # the policy said: a missing tensor is unchanged
                continue
            if not base_entry.shape:
                parts.append((m, entry, 0, 1))
            else:
                stop = min(span.stop, entry.shape[0])
                if stop <= span.start:
                    parts.append(None)
                    continue
                parts.append((m, entry, span.start, stop))
                uniform &= stop == span.stop
            uniform &= entry.dtype == base_entry.dtype and _row_bytes(entry) == _row_bytes(base_entry)
        return ("stage" if uniform else "mixed"), parts

    # -- the work of one model's part -------------------------------------------------------------------
    def _read_part(self, span: Span, part: tuple[int, TensorEntry, int, int], out: torch.Tensor) -> torch.Tensor:
        """Read rows [first, stop) of one model into the flat byte tensor `out`; hash them; return `out`."""
        m, entry, first, stop = part
        rb = _row_bytes(entry)
        if out.numel() and isinstance(entry, MappedEntry):  # an agent read in the base's layout: piece by piece
            view = memoryview(out.numpy())
            for src, at, byte, nbytes in entry.byte_pieces(first * rb if entry.shape else 0, out.numel()):
                self.files.read_into(src, byte, view[at:at + nbytes])
        elif out.numel():
            self.files.read_into(entry, first * rb if entry.shape else 0, memoryview(out.numpy()))
        if self.fingerprinter is not None:
            # By the stored name: a view may read one stored tensor under two names (an untied head).
            self.fingerprinter.add_bytes(m, entry.name, first, stop - first, out)
        return out

    def _jobs(self, span: Span) -> tuple[Callable[[], ChunkData], list[tuple[int, Callable[[], Any]]]]:
        """The per-model read jobs of a span, and how to assemble their results into ChunkData."""
        layout, parts = self._plan(span)
        base_entry = self.base.tensors[span.tensor]
        dtype = ST_TO_TORCH[base_entry.dtype]
        shape = (span.stop - span.start, *base_entry.shape[1:]) if base_entry.shape else ()
        if layout == "stage":
            row_elems = span.numel
            nbytes = len(self.models) * row_elems * ITEMSIZE[base_entry.dtype]
            slab = self.pool.take(nbytes)
            flat = slab[:nbytes].view(len(self.models), -1)  # (1 + N, E · itemsize) bytes
            jobs = [(p[0], (lambda p=p: self._read_part(span, p, flat[p[0]]))) for p in parts if p is not None]

            def assemble() -> ChunkData:
                if row_elems:
                    stage = flat.view(dtype).view(len(self.models), row_elems)
                else:  # an empty tensor: zero bytes cannot be reinterpreted as a wider dtype
                    stage = torch.empty((len(self.models), 0), dtype=dtype)
                agents: list[torch.Tensor | None] = []
                for m, p in enumerate(parts[1:], start=1):
                    if p is None:
                        stage[m].copy_(stage[0])
                        agents.append(None)
                    else:
                        agents.append(stage[m].view(shape))
                return ChunkData(span, stage[0].view(shape), agents, stage, slab, self.pool)

            return assemble, jobs

        bufs: dict[int, torch.Tensor] = {}

        def job(p: tuple[int, TensorEntry, int, int]) -> None:
            m, entry, first, stop = p
            bufs[m] = self._read_part(span, p, torch.empty((stop - first) * _row_bytes(entry), dtype=torch.uint8))

        jobs = [(p[0], (lambda p=p: job(p))) for p in parts if p is not None]

        def assemble_mixed() -> ChunkData:
            base = bufs[0].view(dtype).view(shape)
            agents = []
            for m, p in enumerate(parts[1:], start=1):
                if p is None:
                    agents.append(None)
                    continue
                _, entry, first, stop = p
                eshape = (stop - first, *entry.shape[1:]) if entry.shape else ()
                part = bufs[m].view(ST_TO_TORCH[entry.dtype]).view(eshape)
                if stop < span.stop:  # an agent with fewer rows (e.g. a smaller vocabulary): pad with base
                    # rows in a dtype that holds both exactly, so τ still comes from the stored values.
                    wide = part.dtype if part.dtype == base.dtype else torch.float32
                    part = torch.cat([part.to(wide), base[stop - span.start:].to(wide)])
                agents.append(part)
            return ChunkData(span, base, agents)

        return assemble_mixed, jobs

    # -- reading ----------------------------------------------------------------------------------------
    def read(self, span: Span) -> ChunkData:
        """Read one span on this thread."""
        assemble, jobs = self._jobs(span)
        for _, job in jobs:
            job()
        return assemble()

    def stream(self, items: Iterable[tuple[Span | None, Any]],
               depth: int = 2) -> Iterator[tuple[Any, ChunkData | None]]:
        """For each (span or None, tag), yield (tag, ChunkData or None), reading up to `depth` spans ahead
        on the reader threads. The consumer releases each ChunkData when done with it."""
        if not self._workers:
            self._workers = [ThreadPoolExecutor(1, thread_name_prefix=f"ram-reader{i}") for i in range(self.threads)]
        pending: deque[tuple[Any, Callable[[], ChunkData] | None, list[Future]]] = deque()
        it = iter(items)
        exhausted = False
        reading = 0
        try:
            while True:
                while not exhausted and reading < depth:
                    try:
                        span, tag = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    if span is None:
                        pending.append((tag, None, []))
                        continue
                    assemble, jobs = self._jobs(span)
                    futures = [self._workers[m % self.threads].submit(job) for m, job in jobs]
                    pending.append((tag, assemble, futures))
                    reading += 1
                if not pending:
                    return
                tag, assemble, futures = pending.popleft()
                if assemble is None:
                    yield tag, None
                    continue
                reading -= 1
                for f in futures:
                    f.result()
                yield tag, assemble()
        finally:
            for _, _, futures in pending:
                for f in futures:
                    f.cancel()
            for _, _, futures in pending:
                for f in futures:
                    if not f.cancelled():
                        try:
                            f.result()
                        except BaseException:  # noqa: BLE001 — only waiting: the first error is already raised
                            pass

    def close(self) -> None:
        for w in self._workers:
            w.shutdown(wait=True, cancel_futures=True)
        self._workers = []
        self.files.close()


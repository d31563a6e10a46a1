"""Aligned, prefetched reading of base and agent chunks: the I/O stage shared by analysis and merge."""
from __future__ import annotations

import math
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, TypeVar

import torch

from .checkpoint import Checkpoint
from .fingerprint import Fingerprinter

DEFAULT_CHUNK_ELEMS = 1 << 23  # 8M elements: 32 MB per model in float32


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


@dataclass
class ChunkData:
    """Stored-dtype data of one span: base and each agent (None where an agent counts as unchanged)."""

    span: Span
    base: torch.Tensor
    agents: list[torch.Tensor | None]


class AlignedReader:
    """Reads the same rows from the base and every agent, padding what an agent lacks with base rows.

    With a `fingerprinter`, every row read is also hashed (see merging/fingerprint.py): identity of the
    inputs comes from the read that happens anyway.
    """

    # Mapped shard pages count towards resident memory until unmapped: close files after this many bytes.
    RELEASE_EVERY = 256 << 20

    def __init__(self, base: Checkpoint, agents: list[Checkpoint], fingerprinter: Fingerprinter | None = None) -> None:
        self.base = base
        self.agents = agents
        self.fingerprinter = fingerprinter
        self._since_release = 0

    def read(self, span: Span) -> ChunkData:
        shape = self.base.tensors[span.tensor].shape
        ranged = len(shape) > 0
        base = self.base.read(span.tensor, span.start, span.stop) if ranged else self.base.read(span.tensor)
        self._note(0, span, base)
        agents: list[torch.Tensor | None] = []
        for i, a in enumerate(self.agents, start=1):
            entry = a.tensors.get(span.tensor)
            if entry is None:
                agents.append(None)  # the policy said: a missing tensor is unchanged
                continue
            if not ranged:
                agents.append(self._note(i, span, a.read(span.tensor)))
                continue
            stop = min(span.stop, entry.shape[0])
            if stop <= span.start:
                agents.append(None)
                continue
            part = self._note(i, span, a.read(span.tensor, span.start, stop))
            if stop < span.stop:  # agent has fewer rows (e.g. a smaller vocabulary): pad with base rows
                # in a dtype that holds both exactly, so τ still comes from the stored values.
                wide = part.dtype if part.dtype == base.dtype else torch.float32
                part = torch.cat([part.to(wide), base[stop - span.start:].to(wide)])
            agents.append(part)
        self._since_release += base.nbytes
        if self._since_release >= self.RELEASE_EVERY:
            self.release()
        return ChunkData(span, base, agents)

    def _note(self, model: int, span: Span, data: torch.Tensor) -> torch.Tensor:
        if self.fingerprinter is not None:
            self.fingerprinter.add(model, span.tensor, span.start, data)
        return data

    def release(self) -> None:
        self._since_release = 0
        for c in [self.base, *self.agents]:
            c.release()


T = TypeVar("T")


def prefetch(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Run an iterator in a background thread, keeping up to `depth` items ready (reading overlaps compute)."""
    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()
    done = object()

    def work() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(("item", item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(("end", done))
        except BaseException as exc:  # hand the error to the consumer
            q.put(("error", exc))

    thread = threading.Thread(target=work, name="ram-reader", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()
        while thread.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(0.05)


class BackgroundWriter:
    """Runs write callbacks on one background thread so writing overlaps reading and compute."""

    def __init__(self, depth: int = 2) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ram-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            if self._error is None:
                try:
                    job()
                except BaseException as exc:
                    self._error = exc

    def submit(self, job: Callable[[], None]) -> None:
        if self._error is not None:
            raise self._error
        self._q.put(job)

    def close(self) -> None:
        """Wait for every queued write; re-raise the first write error."""
        self._q.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error

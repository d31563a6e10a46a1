"""Writing on background threads, so that writing overlaps reading and compute."""
from __future__ import annotations

import queue
import threading
from typing import Callable


class BackgroundWriter:
    """Runs write callbacks on background threads so writing overlaps reading and compute.

    Jobs run in submission order on one thread (`threads=1`), or on several when every job is
    independent of the others' order (writes by offset)."""

    def __init__(self, depth: int = 2, threads: int = 1) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._error: BaseException | None = None
        self._threads = [threading.Thread(target=self._run, name=f"ram-writer{i}", daemon=True)
                         for i in range(max(1, threads))]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            if self._error is None:
                try:
                    job()
                except BaseException as exc:  # noqa: BLE001 — kept, and raised on the caller's thread
                    self._error = exc

    def submit(self, job: Callable[[], None]) -> None:
        if self._error is not None:
            raise self._error
        self._q.put(job)

    def close(self) -> None:
        """Wait for every queued write; re-raise the first write error."""
        for _ in self._threads:
            self._q.put(None)
        for t in self._threads:
            t.join()
        if self._error is not None:
            raise self._error

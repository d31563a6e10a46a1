"""Fused CPU kernels (numba): one pass per element instead of one torch op per step.

Each kernel reproduces, bit for bit, the float32 arithmetic of the matching torch code in
`merging.methods` (same operations in the same order), which stays the reference and the GPU path;
tests compare the two. Set RAM_STUDIO_KERNELS=torch to force the torch path on the CPU.

Kernels are never waited for. The first pass asks for the ones it needs (`prepare`); a background
thread imports numba and loads them from numba's on-disk cache, or compiles them there on the first
use of a fresh install (about a minute for all of them). Until a kernel is ready the engine runs the
torch path, which gives the same bits; it switches at a chunk (or, for methods with passes, a tensor)
boundary. When the cache already holds a kernel (a marker written when a process first made it ready,
one per kernel and dtype, besides one after a complete warm-up, says so), `prepare` and the engine wait for
the load, a fraction of a second. `python -m merging.kernels` compiles all of
them ahead of time (e.g. in an image build).
"""
from __future__ import annotations

import importlib.util
import os
import threading
import time
from typing import Iterable

from merging.kernels.marker import marker_path

# numba is a dependency, but the torch path keeps everything working without it. Looking it up is
# cheap; importing it (a few tenths of a second) happens on the warm-up thread.
HAVE_NUMBA = importlib.util.find_spec("numba") is not None

DTYPES = ("bf16", "f32")  # what the kernels read: bf16 bit patterns, or float32
ALL = ("count_and_peak", "peak_abs_tau", "overlap_histogram", "tensor_stats", "ram", "linear", "dare",
       "abs_bits_histogram",
       "ties_merge", "first_nonfinite", "values_differ")


def kernels_enabled() -> bool:
    """Whether CPU work should use the fused kernels (numba present and not disabled)."""
    return HAVE_NUMBA and os.environ.get("RAM_STUDIO_KERNELS", "numba").lower() != "torch"


_ANY_DTYPE = ("first_nonfinite", "values_differ")  # scans of output bits: one warm-up covers every dtype


def _key(name: str, dtype: str) -> tuple[str, str]:
    return (name, "bf16") if name in _ANY_DTYPE else (name, dtype)


class Warmup:
    """One background thread that makes kernels ready, in the order they were asked for."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._ready: set[tuple[str, str]] = set()
        self._queue: list[tuple[str, str]] = []
        self._failed: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.log: list[str] = []

    def request(self, names: Iterable[str], dtypes: Iterable[str]) -> None:
        with self._lock:
            for d in dtypes:
                for n in names:
                    k = _key(n, d)
                    if k not in self._ready and k not in self._queue:
                        self._queue.append(k)
            if self._queue and self._thread is None and self._failed is None:
                self._thread = threading.Thread(target=self._run, name="ram-kernels", daemon=True)
                self._thread.start()

    def ready(self, names: Iterable[str], dtype: str) -> bool:
        with self._lock:
            return all(_key(n, dtype) in self._ready for n in names)

    def wait(self, names: Iterable[str], dtype: str, timeout: float | None) -> bool:
        names = tuple(names)
        with self._lock:
            return self._lock.wait_for(lambda: self._failed is not None
                                       or all(_key(n, dtype) in self._ready for n in names), timeout) and \
                self._failed is None

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            from merging.kernels import warm as kernel_warmup

            while True:
                with self._lock:
                    if not self._queue:
                        self._thread = None
                        return
                    name, dtype = self._queue[0]
                t = time.perf_counter()
                fresh = kernel_warmup.warm(name, dtype)
                with self._lock:
                    self._queue.pop(0)
                    self._ready.add((name, dtype))
                    kernel_warmup.mark_cached(dtype, name)  # the next process waits for this one's load (settle)
                    if all(_key(n, dtype) in self._ready for n in ALL):
                        kernel_warmup.mark_cached(dtype)
                    self.log.append(f"{name}[{dtype}] {'compiled' if fresh else 'loaded'} in "
                                    f"{time.perf_counter() - t:.2f} s ({time.perf_counter() - start:.1f} s)")
                    self._lock.notify_all()
        except BaseException as exc:  # noqa: BLE001 — the torch path goes on; the kernels stay off for this process
            with self._lock:
                self._failed = exc
                self._thread = None
                self._lock.notify_all()


_WARMUP = Warmup()


def prepare(names: Iterable[str] = ALL, dtypes: Iterable[str] = DTYPES, wait: bool = True) -> None:
    """Ask for kernels (needed first, first); wait (with `wait`) only if they are already compiled on disk."""
    if not kernels_enabled():
        return
    names, dtypes = tuple(names), tuple(dtypes)
    _WARMUP.request(names, dtypes)
    for d in dtypes:
        if wait and cached_marker_exists(d, names):
            _WARMUP.wait(names, d, timeout=30.0)


def preload() -> tuple[str, ...]:
    """Load, in the background, every kernel already compiled on disk (never starts a compile): a long-lived
    process (the app's server) calls it as it starts, so its first pass does not wait for numba to import and
    load them. Returns the dtypes asked for."""
    if not kernels_enabled():
        return ()
    dtypes = tuple(d for d in DTYPES if cached_marker_exists(d))
    if dtypes:
        _WARMUP.request(ALL, dtypes)
    return dtypes


def settle(names: Iterable[str], dtype: str) -> None:
    """Wait for kernels asked for with `prepare(wait=False)` if they are being loaded from the cache (a
    fraction of a second, overlapping the first reads), never for a compile. A kernel counts as cached once
    any process made it ready since the kernels' source last changed (its own marker), not only after a
    full warm-up: otherwise a merge that starts without a counting pass (statistics from a cached analysis,
    as in the app) ran its first and largest tensor, the embeddings, on the slower torch path."""
    if kernels_enabled() and cached_marker_exists(dtype, names):
        _WARMUP.wait(tuple(names), dtype, timeout=30.0)


def ready(names: Iterable[str], dtype: str) -> bool:
    """Whether these kernels can run now without a compile (never waits)."""
    return kernels_enabled() and _WARMUP.ready(names, dtype)


def wait_ready(names: Iterable[str] = ALL, dtypes: Iterable[str] = DTYPES, timeout: float | None = None) -> bool:
    """Ask for kernels and wait until they are ready (compiling if need be): for tests and warm-ups."""
    if not kernels_enabled():
        return False
    names, dtypes = tuple(names), tuple(dtypes)
    _WARMUP.request(names, dtypes)
    return all(_WARMUP.wait(names, d, timeout) for d in dtypes)


def warmup_log() -> list[str]:
    return list(_WARMUP.log)


def cached_marker_exists(dtype: str, names: Iterable[str] = ()) -> bool:
    """Whether every kernel of `dtype` is in numba's cache, or each of `names` is."""
    try:
        if os.path.exists(marker_path(dtype)):
            return True
        keys = [_key(n, dtype) for n in names]
        return bool(keys) and all(os.path.exists(marker_path(d, n)) for n, d in keys)
    except OSError:
        return False


class one_thread_for:
    """Run the numba kernels called inside on this thread alone when their input makes one partition
    (`partitions` == 1): a parallel region with one iteration still wakes the thread pool, which costs
    0.1–30 ms per call on a busy machine against ~0.1 ms of work for a small tensor (100,000 tiny tensors:
    minutes). Results do not depend on the thread count (fixed partitions)."""

    def __init__(self, partitions: int) -> None:
        self.serial = partitions <= 1 and HAVE_NUMBA
        self._before = 0

    def __enter__(self) -> "one_thread_for":
        if self.serial:
            from merging.kernels.numba_import import numba

            self._before = numba.get_num_threads()
            numba.set_num_threads(1)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.serial:
            from merging.kernels.numba_import import numba

            numba.set_num_threads(self._before)


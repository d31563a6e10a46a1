"""Warm-up: dummy calls with the argument types the engine uses, so that each kernel is loaded from numba's
cache (or compiled into it) before the engine switches to it; and the markers saying a kernel is cached."""
from __future__ import annotations

import os

import numpy as np

from merging.kernels import marker
from merging.kernels.dare import dare
from merging.kernels.guards import first_nonfinite, values_differ
from merging.kernels.linear import linear
from merging.kernels.ram import ram
from merging.kernels.statistics import count_and_peak, overlap_histogram, peak_abs_tau
from merging.kernels.tensor_stats import tensor_stats
from merging.kernels.ties import abs_bits_histogram, ties_partitions


def _dummies(dtype: str):
    raw = np.uint16 if dtype == "bf16" else np.float32
    stage = np.zeros((4, 8), raw)
    return stage[0], stage[1:], np.zeros(8, np.float32), np.zeros((1, 3), np.float32)


def _warm_calls(name: str, dtype: str):
    base, agents, out, peak = _dummies(dtype)
    ladder = np.zeros(8, np.float32)
    if name == "count_and_peak":
        return [(count_and_peak, (base, agents, np.float32(0), np.zeros(256, np.float32), False, 1))]
    if name == "peak_abs_tau":
        return [(peak_abs_tau, (base, agents, 1))]
    if name == "overlap_histogram":
        return [(overlap_histogram, (base, agents, ladder, np.array([0.1, 0.3]), 1, False,
                                     np.zeros((256, 8), np.float32), np.zeros(256, np.int32),
                                     np.zeros(256, np.float32), 1))]
    if name == "tensor_stats":
        return [(tensor_stats, _tensor_stats_args(base, agents, steps)) for steps in (False, True)]
    if name == "ram":
        return [(ram, (base, agents, np.float32(0), np.zeros(256, np.float32), False, np.ones(3, np.float32), True,
                       out, peak))]
    if name == "linear":
        return [(linear, (base, agents, np.float32(1), out, peak))]
    if name == "dare":
        return [(dare, (base, agents, np.zeros(3, np.uint64), 0, np.float32(0.5), np.float32(2), np.float32(1),
                        flag, out, peak)) for flag in (False, True)]
    if name == "abs_bits_histogram":
        return [(abs_bits_histogram, (base, agents, flag, np.zeros(3, np.int32), 1)) for flag in (False, True)]
    if name == "ties_merge":
        return [(ties_partitions, (base, agents, np.zeros(3, np.float32), np.zeros(3, np.int64),
                                    np.zeros((1, 3), np.int64), np.float32(1), out, peak))]
    if name in ("first_nonfinite", "values_differ"):  # the output dtype's bit patterns
        calls = []
        for bits in (np.uint16, np.uint32, np.uint64):
            x = np.zeros(4, bits)
            calls.append((first_nonfinite, (x, bits(1))) if name == "first_nonfinite" else
                         (values_differ, (x, x, bits(1))))
        return calls if dtype == "bf16" else []
    raise KeyError(name)


def _tensor_stats_args(base, agents, steps: bool) -> tuple:
    """Arguments of the types analysis.batched passes (one tensor of 8 elements, 3 agents, 8 ε)."""
    n, L = agents.shape[0], 8
    P = n * (n - 1) // 2
    return (base, agents, np.array([0, 8], np.int64), np.zeros(L, np.float32), np.array([0.1, 0.3]), steps,
            np.zeros((256, L), np.float32), np.zeros(256, np.int32), np.zeros(256, np.float32), np.zeros(256), 1, 1,
            np.zeros((1, n, L, 5), np.int64), np.zeros((1, n, L, n), np.int64), np.zeros((1, n, L, 6)),
            np.zeros((1, n, L, 2)), np.zeros((1, P, L, 2), np.int64), np.zeros((1, P, L, 3)),
            np.zeros((1, n), np.int64), np.zeros((1, L), np.int64), np.zeros(1, np.bool_))


_FORGOTTEN: set[int] = set()


def _forget_stale_cache(fn) -> None:
    """Empty numba's on-disk index for `fn`, once per process: numba keys a kernel's cache on its own file only,
    but the kernels inline helpers from other files of merging/kernels (common.py, ties.py), so a change there
    would otherwise load a kernel compiled from the old helpers. Called only when no marker for the current
    stamp over every kernel source exists (`marker.py`), i.e. the first warm-up after any kernel file changed."""
    cache = getattr(fn, "_cache", None)
    if id(fn) in _FORGOTTEN or not hasattr(cache, "flush"):
        return
    _FORGOTTEN.add(id(fn))
    try:
        cache.flush()
    except OSError:  # a read-only cache (an installed package): its files never change
        pass


def warm(name: str, dtype: str) -> bool:
    """Make kernel `name` ready for `dtype`; True if it had to be compiled (not found in the cache)."""
    fresh = False
    stale = not (os.path.exists(marker.marker_path(dtype, name)) or os.path.exists(marker.marker_path(dtype)))
    for fn, args in _warm_calls(name, dtype):
        if stale:
            _forget_stale_cache(fn)
        before = sum(fn.stats.cache_misses.values())
        fn(*args)
        fresh |= sum(fn.stats.cache_misses.values()) > before
    return fresh


def mark_cached(dtype: str, kernel: str | None = None) -> None:
    """Note that every kernel of `dtype` (or the one `kernel`) is in numba's cache (see merging.kernels.prepare)."""
    try:
        path = marker.marker_path(dtype, kernel)
        if os.path.isdir(os.path.dirname(path)):
            with open(path, "w") as f:
                f.write("ready\n")
    except OSError:
        pass

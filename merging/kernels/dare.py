"""The DARE kernel (merging.methods.dare): hashed drops, rescale, then task arithmetic or TIES.
"""
from __future__ import annotations

import numpy as np

from merging.kernels.common import BLOCK, LANES, ONE, ZERO, fold_peak, part_span, tau_block, widen
from merging.kernels.numba_import import numba as nb
from merging.kernels.ties import elect_mean_block


@nb.njit(inline="always")
def _mix(x):
    """splitmix64 finaliser on uint64 (wrapping), identical to merging.methods.dare.uniform."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@nb.njit(parallel=True, cache=True, nogil=True)
def dare(base, agents, keys, offset, p_drop, scale, lam, ties_mode, out, peak):
    """DARE+TA (ties_mode False) or DARE+TIES (True): drop by hashed uniforms, rescale, combine, × λ."""
    n, e = len(agents), base.shape[0]
    nparts = peak.shape[0]
    inv = np.float32(1.0 / (1 << 24))
    for p in nb.prange(nparts):
        lo, hi = part_span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        tau = np.empty(BLOCK, np.float32)
        vals = np.empty((n, BLOCK), np.float32)
        lanes = np.zeros((n, LANES), np.float32)
        bad = np.zeros((n, LANES), np.bool_)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            widen(base, s, m, bb)
            for t in range(n):
                tau_block(agents[t], s, m, bb, tau, lanes[t], bad[t])
                kt = keys[t]
                for j in range(m):
                    x = _mix(np.uint64(offset + s + j) + kt)
                    r = np.float32((x >> np.uint64(40)) & np.uint64(0xFFFFFF)) * inv
                    vals[t, j] = (tau[j] * (ONE if r >= p_drop else ZERO)) * scale
            if ties_mode:
                elect_mean_block(vals, n, m, out, s, bb, lam)
            else:
                for j in range(m):
                    total = ZERO
                    for t in range(n):
                        total += vals[t, j]
                    out[s + j] = bb[j] + total * lam
        for t in range(n):
            peak[p, t] = fold_peak(lanes[t], bad[t])

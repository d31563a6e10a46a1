"""The task arithmetic / averaging kernel (merging.methods.linear).
"""
from __future__ import annotations

import numpy as np

from merging.kernels.common import BLOCK, LANES, ZERO, fold_peak, part_span, tau_block, widen
from merging.kernels.numba_import import numba as nb


@nb.njit(parallel=True, cache=True, nogil=True)
def linear(base, agents, scale, out, peak):
    """Task arithmetic / averaging: out = θ0 + (Σ_t τ_t)·scale."""
    n, e = len(agents), base.shape[0]
    nparts = peak.shape[0]
    for p in nb.prange(nparts):
        lo, hi = part_span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        tau = np.empty(BLOCK, np.float32)
        total = np.empty(BLOCK, np.float32)
        lanes = np.zeros((n, LANES), np.float32)
        bad = np.zeros((n, LANES), np.bool_)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            widen(base, s, m, bb)
            for j in range(m):
                total[j] = ZERO  # torch's sum starts from +0, which matters only for signed zeros
            for t in range(n):
                tau_block(agents[t], s, m, bb, tau, lanes[t], bad[t])
                for j in range(m):
                    total[j] += tau[j]
            for j in range(m):
                out[s + j] = bb[j] + total[j] * scale
        for t in range(n):
            peak[p, t] = fold_peak(lanes[t], bad[t])

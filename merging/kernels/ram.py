"""The RAM / RAM+ merge kernel (merging.methods.ram).
"""
from __future__ import annotations

import numpy as np

from merging.kernels.common import BLOCK, LANES, ZERO, block_thresholds, fold_peak, part_span, tau_block, widen
from merging.kernels.numba_import import numba as nb


@nb.njit(parallel=True, cache=True, nogil=True)
def ram(base, agents, eps, thr, steps, lam, use_lam, out, peak):
    """RAM / RAM+ (Eq. 7): out = θ0 + τ_m (float32); per-agent max |τ| into `peak` (nparts, N). An element
    is active where |τ| > ε, or with `steps` where |τ| > thr[exponent field of the base] (the step rule).

    The same float32 operations as merging.methods.ram in the same order: the sum of the active τ_t
    (t ascending, from +0), λ_t·τ_t of the one active agent, the sum / c where c ≥ 2."""
    n, e = len(agents), base.shape[0]
    nparts = peak.shape[0]
    for p in nb.prange(nparts):
        lo, hi = part_span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        tau = np.empty(BLOCK, np.float32)
        total = np.empty(BLOCK, np.float32)
        uniq = np.empty(BLOCK, np.float32)
        c = np.empty(BLOCK, np.int32)
        th = np.empty(BLOCK, np.float32)
        lanes = np.zeros((n, LANES), np.float32)
        bad = np.zeros((n, LANES), np.bool_)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            widen(base, s, m, bb)
            block_thresholds(bb, m, eps, thr, steps, th)
            for j in range(m):
                total[j] = ZERO
                uniq[j] = ZERO
                c[j] = 0
            for t in range(n):
                tau_block(agents[t], s, m, bb, tau, lanes[t], bad[t])
                lt = lam[t]
                for j in range(m):
                    x = tau[j]
                    act = abs(x) > th[j]
                    c[j] += 1 if act else 0
                    total[j] += x if act else ZERO  # adding +0 leaves the sum as it is
                    uniq[j] = lt * x if act else uniq[j]
            for j in range(m):
                k = c[j]
                mean = total[j] / np.float32(max(k, 1))
                one = uniq[j] if use_lam else total[j]
                # c = 0: torch adds a +0 sum here, turning a −0 base into +0
                out[s + j] = bb[j] + (ZERO if k == 0 else (one if k == 1 else mean))
        for t in range(n):
            peak[p, t] = fold_peak(lanes[t], bad[t])

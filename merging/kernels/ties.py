"""The TIES kernels (merging.methods.ties): the top-k passes' histograms, the merge, and the sign
election DARE+TIES shares.
"""
from __future__ import annotations

import numpy as np

from merging.kernels.common import BLOCK, LANES, ONE, ZERO, f32_bits, fold_peak, load, part_span, tau_block, widen
from merging.kernels.numba_import import numba as nb


@nb.njit(inline="always")
def elect_mean_block(vals, n, m, out, s, bb, lam):
    """TIES sign election (zero sum elects +) and disjoint mean over the block's (n, m) values, as
    merging.methods.ties.elect_and_mean; out[s + j] = θ0 + mean·λ."""
    for j in range(m):
        total = ZERO
        for t in range(n):
            total += vals[t, j]
        positive = total >= ZERO
        agree = ZERO
        count = 0
        for t in range(n):
            v = vals[t, j]
            ok = (v > ZERO) if positive else (v < ZERO)  # sign(v) equals the elected sign, v ≠ 0
            agree += v if ok else ZERO
            count += 1 if ok else 0
        mean = ZERO if count == 0 else agree / np.float32(max(count, 1))
        out[s + j] = bb[j] + mean * lam


@nb.njit(parallel=True, cache=True, nogil=True)
def abs_bits_histogram(base, agents, fine, his, nparts):
    """TIES passes: per-partition, per-agent histogram (nparts, N, bins) of the high 16 bits of |τ|'s
    float32 pattern (coarse), or of the low 16 bits of the elements whose high bits equal his[t] (fine)."""
    n, e = len(agents), base.shape[0]
    bins = 65536 if fine else 32768
    acc = np.zeros((nparts, n, bins), np.int64)
    for p in nb.prange(nparts):
        lo, hi = part_span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        key = np.empty(BLOCK, np.int32)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            widen(base, s, m, bb)
            for t in range(n):
                row = agents[t]
                h = acc[p, t]
                if fine:
                    c = 0
                    target = his[t]
                    for j in range(m):  # compact the low bits of the elements in the selected bin
                        bits = f32_bits(abs(load(row, s + j) - bb[j]))
                        key[c] = bits & 0xFFFF
                        c += 1 if (bits >> 16) == target else 0
                    for i in range(c):
                        h[key[i]] += 1
                else:
                    for j in range(m):
                        key[j] = f32_bits(abs(load(row, s + j) - bb[j])) >> 16
                    for j in range(0, m - 1, 2):
                        h[key[j]] += 1
                        h[key[j + 1]] += 1
                    if m % 2:
                        h[key[m - 1]] += 1
    return acc


@nb.njit(parallel=True, cache=True, nogil=True)
def ties_partitions(base, agents, thr, keep_equal, first_rank, lam, out, peak):
    """TIES merge where partition p's first threshold-equal element of agent t has rank first_rank[p, t]."""
    n, e = len(agents), base.shape[0]
    nparts = peak.shape[0]
    for p in nb.prange(nparts):
        lo, hi = part_span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        tau = np.empty(BLOCK, np.float32)
        vals = np.empty((n, BLOCK), np.float32)
        lanes = np.zeros((n, LANES), np.float32)
        bad = np.zeros((n, LANES), np.bool_)
        seen = first_rank[p].copy()
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            widen(base, s, m, bb)
            for t in range(n):
                tau_block(agents[t], s, m, bb, tau, lanes[t], bad[t])
                th = thr[t]
                ke = keep_equal[t]
                st = seen[t]
                for j in range(m):
                    x = tau[j]
                    a = abs(x)
                    keep = a > th
                    if a == th:  # rare: ties at the threshold, kept in flat-index order
                        st += 1
                        keep = st <= ke
                    vals[t, j] = x * (ONE if keep else ZERO)
                seen[t] = st
            elect_mean_block(vals, n, m, out, s, bb, lam)
        for t in range(n):
            peak[p, t] = fold_peak(lanes[t], bad[t])


def ties_merge(base, agents, thresholds, keep_equal, first_rank, lam, out, peak):
    """TIES merge of one chunk: exact top-k trim with ties at the threshold kept in flat-index order,
    sign election, disjoint mean, × λ. `thresholds` are |τ| bit patterns (−1: keep all, int32 max:
    keep none); for non-negative floats, comparing values orders them as their bits do. Partition p
    (of peak.shape[0]) starts counting agent t's threshold-equal elements at first_rank[p, t], which
    the fine pass's per-partition histograms provide, so partitions run in parallel."""
    thr = thresholds.astype(np.int32).view(np.float32).copy()
    thr[thresholds < 0] = -1.0  # every |τ| ≥ 0 is above: keep all
    thr[thresholds == np.iinfo(np.int32).max] = np.inf  # no finite |τ| reaches it: keep none
    ties_partitions(base, agents, thr, keep_equal, first_rank, lam, out, peak)

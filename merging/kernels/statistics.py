"""Scans for statistics: each agent's max |τ|, the shared/unique counts at one ε (the counting pass
and tensor-local ρ), and the joint-state histogram of the analysis.
"""
from __future__ import annotations

import numpy as np

from merging.kernels.common import (
    BLOCK,
    LANES,
    ZERO,
    block_thresholds,
    f32_bits,
    fold_peak,
    load,
    part_span,
    tau_block,
    widen,
)
from merging.kernels.numba_import import numba as nb

HALF = np.float32(0.5)

NO_STEPS = np.zeros(256, np.float32)  # the threshold table argument when the rule is an absolute ε

@nb.njit(parallel=True, cache=True, nogil=True)
def peak_abs_tau(base, agents, nparts):
    """Per-partition, per-agent max |τ| (nparts, N); NaN where a |τ| is not finite."""
    n, e = len(agents), base.shape[0]
    peak = np.zeros((nparts, n), np.float32)
    for p in nb.prange(nparts):
        lo, hi = part_span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        tau = np.empty(BLOCK, np.float32)
        lanes = np.zeros((n, LANES), np.float32)
        bad = np.zeros((n, LANES), np.bool_)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            widen(base, s, m, bb)
            for t in range(n):
                tau_block(agents[t], s, m, bb, tau, lanes[t], bad[t])
        for t in range(n):
            peak[p, t] = fold_peak(lanes[t], bad[t])
    return peak


@nb.njit(parallel=True, cache=True, nogil=True)
def count_and_peak(base, agents, eps, thr, steps, nparts):
    """Per-agent shared and unique counts (N, 2) of one chunk at ε (with `steps`: under the step rule,
    thresholds thr[exponent field of the base]), and each agent's max |τ| per partition (nparts, N): the
    counting pass global ρ needs, in one pass over the chunk."""
    n, e = len(agents), base.shape[0]
    acc = np.zeros((nparts, n, 2), np.int64)
    peak = np.zeros((nparts, n), np.float32)
    for p in nb.prange(nparts):
        lo, hi = part_span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        tau = np.empty((n, BLOCK), np.float32)
        c = np.empty(BLOCK, np.int32)
        th = np.empty(BLOCK, np.float32)
        lanes = np.zeros((n, LANES), np.float32)
        bad = np.zeros((n, LANES), np.bool_)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            widen(base, s, m, bb)
            block_thresholds(bb, m, eps, thr, steps, th)
            for j in range(m):
                c[j] = 0
            for t in range(n):
                tau_block(agents[t], s, m, bb, tau[t], lanes[t], bad[t])
                for j in range(m):
                    c[j] += 1 if abs(tau[t, j]) > th[j] else 0
            for t in range(n):
                sh = 0
                un = 0
                for j in range(m):
                    act = abs(tau[t, j]) > th[j]
                    sh += 1 if act and c[j] >= 2 else 0
                    un += 1 if act and c[j] == 1 else 0
                acc[p, t, 0] += sh
                acc[p, t, 1] += un
        for t in range(n):
            peak[p, t] = fold_peak(lanes[t], bad[t])
    return acc.sum(axis=0), peak


def overlap_counts(base, agents, eps, nparts, thr=NO_STEPS, steps=False):
    """Per-agent shared and unique counts (N, 2) of one chunk, for tensor-local ρ."""
    return count_and_peak(base, agents, eps, thr, steps, nparts)[0]


@nb.njit(inline="always")
def bucket(a, lad, L):
    """Number of ladder values below a (the ladder padded with +inf to 8 values: eight compares
    without a loop), L for NaN."""
    k = (np.int32(lad[0] < a) + np.int32(lad[1] < a) + np.int32(lad[2] < a) + np.int32(lad[3] < a)
         + np.int32(lad[4] < a) + np.int32(lad[5] < a) + np.int32(lad[6] < a) + np.int32(lad[7] < a))
    return np.int32(L) if a != a else k


@nb.njit(inline="always")
def bucket_row(a, thr, f, L):
    """Number of the step rule's thresholds at this base weight (thr[f, :L]) below a, L for NaN."""
    k = np.int32(0)
    for i in range(L):
        k += np.int32(thr[f, i] < a)
    return np.int32(L) if a != a else k


@nb.njit(inline="always")
def step_kind(x, u, half_ok, neg):
    """What τ = x is in steps of the base's stored dtype (u: one step at the base weight; `half_ok`: the base is a
    power of two above the smallest normal binade; `neg`: its sign): 0 no change, 1 one step, 2 one step toward
    zero from that power of two (half a step), 3 any other change."""
    toward = half_ok & ((x < ZERO) != neg)
    one = abs(x) == (u * HALF if toward else u)
    return np.int32(0) if x == ZERO else (np.int32(1) + np.int32(toward) if one else np.int32(3))


@nb.njit(parallel=True, cache=True, nogil=True)
def overlap_histogram(base, agents, ladder, fractions, nparts, steps, thr, binmap, ulp, hfield):
    """Joint-state counts for the analysis pass (see analysis/ladder.py); Σ τ_t² per agent and joint state
    (N, states) and Σ τ_a·τ_b per pair of agents (a < b, in order) and joint state (P, states): the same sums
    as the torch path's weighted histograms, which decode into every ε's norms and shared-region
    diagnostics; the dominance tables (N, F, (L+1)²): Σ τ_t² by the interval [start, end) of ladder
    indices where t is active and shared and the active partners' Σ|τ| (float64, in agent order) is below
    fractions[f]·|τ_t| (analysis.ladder._dominance_tables); and the precision table (N, 256·(L+1)·4): per
    agent, counts by (binade of the base, ladder bucket, step kind) (analysis.precision).

    With `steps` the ladder counts steps of the base's stored dtype: bucket k counts the thresholds
    thr[exponent field of the base, :L] below |τ| (merging.methods.steps). `binmap`, `ulp` and `hfield` are
    the stored dtype's binade of each float32 exponent field, its step, and the smallest normal binade's field.

    Block by block: the ladder buckets (k = number of ladder values below |τ|; NaN above all), the joint
    code and the precision key of every element in loops without branches; then the counts, into two
    interleaved tables (so that runs of one state do not wait on each other); then each agent's squares and
    each pair's products, added to its element's row of a (states, N + P) table, so that one element's sums
    share a cache line, while the two largest |τ| of each element are tracked; each agent's precision keys;
    then the dominance intervals of the rare elements where one agent's |τ| is far above every other's.
    Ladders of up to 8 values (the default has 8) take eight compares per |τ|, longer ones a loop."""
    n, e = len(agents), base.shape[0]
    L = ladder.shape[0]
    F = 2  # fractions: (lower, higher)
    f0, f1 = fractions[0], fractions[1]  # ascending
    lad0 = np.float32(ladder[0])
    s_ = 2 * (L + 1)
    states = s_ ** n
    npairs = n * (n - 1) // 2
    pa = np.empty(npairs, np.int64)
    pb = np.empty(npairs, np.int64)
    q = 0
    for ia in range(n):
        for ib in range(ia + 1, n):
            pa[q] = ia
            pb[q] = ib
            q += 1
    width = n + npairs
    cells = (L + 1) * (L + 1)
    pwidth = 256 * (L + 1) * 4
    lad = np.full(8, np.inf, np.float32)
    lad[:min(L, 8)] = ladder[:min(L, 8)]
    counts = np.zeros((nparts, states), np.int64)
    sq = np.zeros((nparts, width, states), np.float64)
    dom = np.zeros((nparts, n, F, cells), np.float64)
    prec = np.zeros((nparts, n, pwidth), np.int64)
    for p in nb.prange(nparts):
        lo, hi = part_span(e, nparts, p)
        cnt = np.zeros((2, states), np.int64)
        sqs = np.zeros((states, width), np.float64)
        dm = np.zeros((n, F, cells), np.float64)
        pt = np.zeros((n, pwidth), np.int64)
        sqv = np.empty(BLOCK, np.float64)
        bb = np.empty(BLOCK, np.float32)
        code = np.empty(BLOCK, np.int32)
        tau = np.empty((n, BLOCK), np.float32)
        key = np.empty((n, BLOCK), np.int32)
        fld = np.empty(BLOCK, np.int32)
        kb = np.empty(BLOCK, np.int32)
        uu = np.empty(BLOCK, np.float32)
        hok = np.empty(BLOCK, np.bool_)
        neg = np.empty(BLOCK, np.bool_)
        lz = np.empty(BLOCK, np.float32)
        bk = np.empty(n, np.int32)  # the buckets of one (rare, dominated) element
        top1 = np.empty(BLOCK, np.float32)
        top2 = np.empty(BLOCK, np.float32)
        flag = np.empty(BLOCK, np.bool_)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            widen(base, s, m, bb)
            for j in range(m):
                code[j] = 0
                top1[j] = ZERO
                top2[j] = ZERO
                fb = f32_bits(bb[j])
                f = (fb >> 23) & 0xFF
                fld[j] = f
                kb[j] = binmap[f] * np.int32(L + 1)
                uu[j] = ulp[f]
                hok[j] = ((fb & 0x7FFFFF) == 0) & (f > hfield)
                neg[j] = fb < 0
                lz[j] = thr[f, 0] if steps else lad0
            mul = np.int32(1)
            for t in range(n):
                row = agents[t][s:s + m]
                tr = tau[t]
                kt = key[t]
                if steps:
                    for j in range(m):
                        x = load(row, j) - bb[j]
                        tr[j] = x
                        ax = abs(x)
                        k = bucket_row(ax, thr, fld[j], L)
                        code[j] += (np.int32(2) * k + np.int32(x > ZERO)) * mul
                        kt[j] = (kb[j] + k) * np.int32(4) + step_kind(x, uu[j], hok[j], neg[j])
                        top2[j] = max(top2[j], min(top1[j], ax))
                        top1[j] = max(top1[j], ax)
                elif L <= 8:
                    for j in range(m):
                        x = load(row, j) - bb[j]
                        tr[j] = x
                        ax = abs(x)
                        k = bucket(ax, lad, L)
                        code[j] += (np.int32(2) * k + np.int32(x > ZERO)) * mul
                        kt[j] = (kb[j] + k) * np.int32(4) + step_kind(x, uu[j], hok[j], neg[j])
                        top2[j] = max(top2[j], min(top1[j], ax))  # the two largest |τ| of the element
                        top1[j] = max(top1[j], ax)
                else:
                    for j in range(m):
                        x = load(row, j) - bb[j]
                        a = abs(x)
                        k = np.int32(0)
                        for i in range(L):
                            k += np.int32(ladder[i] < a)
                        k = np.int32(L) if a != a else k
                        tr[j] = x
                        code[j] += (np.int32(2) * k + np.int32(x > ZERO)) * mul
                        kt[j] = (kb[j] + k) * np.int32(4) + step_kind(x, uu[j], hok[j], neg[j])
                        top2[j] = max(top2[j], min(top1[j], a))
                        top1[j] = max(top1[j], a)
                mul *= np.int32(s_)
            for j in range(0, m - 1, 2):
                cnt[0, code[j]] += 1
                cnt[1, code[j + 1]] += 1
            if m % 2:
                cnt[0, code[m - 1]] += 1
            for t in range(n):
                tr = tau[t]
                for j in range(m):
                    x = np.float64(tr[j])
                    sqv[j] = x * x
                for j in range(m):
                    sqs[code[j], t] += sqv[j]
            for q in range(npairs):
                ta = tau[pa[q]]
                tb = tau[pb[q]]
                for j in range(m):
                    sqv[j] = np.float64(ta[j]) * np.float64(tb[j])
                for j in range(m):
                    sqs[code[j], n + q] += sqv[j]
            for t in range(n):
                kt = key[t]
                ptt = pt[t]
                for j in range(m):
                    ptt[kt[j]] += 1
            # Dominance. For ε indices before `end`, the partner with the largest |τ| is active, so the
            # partners' Σ|τ| is at least that |τ|: only the agent with the largest |τ| can be dominant, and
            # only where the runner-up is active at the smallest ε and below the higher fraction of it. Such
            # elements are rare; each is handled in registers (the torch path adds the others to cells that
            # decode to nothing).
            hits = 0
            for j in range(m):
                ok = (top2[j] > lz[j]) & (np.float64(top2[j]) < f1 * np.float64(top1[j]))
                flag[j] = ok
                hits += np.int32(ok)
            if hits == 0:
                continue
            for j in range(m):
                if flag[j]:
                    t = 0  # the agent with the largest |τ|
                    for o in range(n):
                        a32 = abs(tau[o, j])
                        t = o if a32 == top1[j] else t
                        if steps:
                            bk[o] = bucket_row(a32, thr, fld[j], L)
                        elif L <= 8:
                            bk[o] = bucket(a32, lad, L)
                        else:
                            k = np.int32(0)
                            for i in range(L):
                                k += np.int32(ladder[i] < a32)
                            bk[o] = np.int32(L) if a32 != a32 else k
                    mt = np.float64(top1[j])
                    end = 0  # the first index where t or all of its partners are inactive
                    for o in range(n):
                        end = max(end, bk[o]) if o != t else end
                    end = min(end, bk[t])
                    thr0 = f0 * mt
                    thr1 = f1 * mt
                    # start: the least candidate index (0 or a partner's bucket) where the active partners'
                    # Σ|τ| (in agent order) is below the fraction of |τ_t|; it only falls as the index grows
                    st0 = L
                    st1 = L
                    for c in range(n):
                        cv = 0 if c == t else bk[c]
                        part = 0.0
                        for o in range(n):
                            part += abs(np.float64(tau[o, j])) if (o != t) & (bk[o] > cv) else 0.0
                        st0 = min(st0, cv) if part < thr0 else st0
                        st1 = min(st1, cv) if part < thr1 else st1
                    w = mt * mt
                    dm[t, 0, st0 * (L + 1) + end] += w
                    dm[t, 1, st1 * (L + 1) + end] += w
        for i in range(states):
            counts[p, i] = cnt[0, i] + cnt[1, i]
        for t in range(width):
            for i in range(states):
                sq[p, t, i] = sqs[i, t]
        for t in range(n):
            for f in range(F):
                for i in range(cells):
                    dom[p, t, f, i] = dm[t, f, i]
            for i in range(pwidth):
                prec[p, t, i] = pt[t, i]
    total = sq.sum(axis=0)
    return counts.sum(axis=0), total[:n].copy(), total[n:].copy(), dom.sum(axis=0), prec.sum(axis=0)

"""The numba kernels.

Inputs are the stored values: `base` (E,) and `agents` (N, E) (or a tuple of N arrays), either all
bfloat16 (passed as uint16 bit patterns) or all float32. Each kernel splits E into partitions (a fixed
number for a given E, so results never depend on the thread count) and walks each partition in blocks
that stay in L1 cache: τ = agent − base is formed in float32 exactly like the torch path (a bf16 value
widens to float32 by a 16-bit shift of its bits, done in registers), one agent at a time over the block
in loops without branches that the compiler vectorises, and the per-element decision is taken with
selects, not jumps: the agents' updates are random-looking, so a branch per element mispredicts often.
Literals are float32 on purpose: a float64 constant would silently change the arithmetic.
"""
from __future__ import annotations

import os

import llvmlite.ir as ir
import numba as nb
import numpy as np
from numba.core import types
from numba.extending import intrinsic, overload

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_MAXF = np.float32(3.4028235e38)
BLOCK = 2048  # elements per block: the block's τ of a few agents stays in L1 cache
LANES = 16  # independent running maxima, so the max |τ| reduction vectorises
PART = 1 << 18  # elements per partition (at most MAX_PARTS partitions per call)
MAX_PARTS = 64


def parts(n: int) -> int:
    """How many independent partitions to split E elements into: a function of E only, so that
    results (the float64 sums of the analysis) do not depend on the number of threads."""
    return max(1, min(-(-n // PART), MAX_PARTS))


def hist_parts(n: int) -> int:
    """Partitions for kernels with a large private histogram each."""
    return max(1, min(-(-n // (4 * PART)), 4))


@intrinsic
def _bf16_to_f32(typingctx, x):
    """The float32 value of a bfloat16 bit pattern: its 16 bits become the high half (exact)."""
    if x != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def _f32_bits(typingctx, x):
    """The bit pattern of a float32 as int32."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


def load(raw, i):
    """Float32 value of element i of a stored array (bf16 bit patterns or float32)."""


@overload(load, inline="always")
def _load_impl(raw, i):
    if raw.dtype == types.uint16:
        def impl(raw, i):
            return _bf16_to_f32(raw[i])
        return impl
    if raw.dtype == types.float32:
        def impl(raw, i):
            return raw[i]
        return impl
    return None


@nb.njit(inline="always")
def _span(e, nparts, p):
    return p * e // nparts, (p + 1) * e // nparts


@nb.njit(inline="always")
def _widen(base, s, m, bb):
    """bb[:m] = float32 base[s:s+m]."""
    for j in range(m):
        bb[j] = load(base, s + j)


@nb.njit(inline="always")
def _taus(row, s, m, bb, tau, lanes, bad):
    """tau[:m] = float32 row[s:s+m] − bb[:m]; running max |τ| in `lanes`, non-finite |τ| noted in `bad`."""
    for j0 in range(0, m - m % LANES, LANES):
        for q in range(LANES):
            x = load(row, s + j0 + q) - bb[j0 + q]
            tau[j0 + q] = x
            a = abs(x)
            lanes[q] = max(lanes[q], a)
            bad[q] = bad[q] | (a != a) | (a > _MAXF)
    for j in range(m - m % LANES, m):
        x = load(row, s + j) - bb[j]
        tau[j] = x
        a = abs(x)
        lanes[0] = max(lanes[0], a)
        bad[0] = bad[0] | (a != a) | (a > _MAXF)


@nb.njit(inline="always")
def _fold_peak(lanes, bad):
    """Max over lanes; NaN when any |τ| was NaN or infinite (check_finite then names where)."""
    m = _ZERO
    b = False
    for q in range(LANES):
        m = max(m, lanes[q])
        b |= bad[q]
    return np.float32(np.nan) if b else m


@nb.njit(parallel=True, cache=True, nogil=True)
def peak_abs_tau(base, agents, nparts):
    """Per-partition, per-agent max |τ| (nparts, N); NaN where a |τ| is not finite."""
    n, e = len(agents), base.shape[0]
    peak = np.zeros((nparts, n), np.float32)
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        tau = np.empty(BLOCK, np.float32)
        lanes = np.zeros((n, LANES), np.float32)
        bad = np.zeros((n, LANES), np.bool_)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            _widen(base, s, m, bb)
            for t in range(n):
                _taus(agents[t], s, m, bb, tau, lanes[t], bad[t])
        for t in range(n):
            peak[p, t] = _fold_peak(lanes[t], bad[t])
    return peak


@nb.njit(parallel=True, cache=True, nogil=True)
def count_and_peak(base, agents, eps, nparts):
    """Per-agent shared and unique counts (N, 2) of one chunk at ε, and each agent's max |τ| per
    partition (nparts, N): the counting pass global ρ needs, in one pass over the chunk."""
    n, e = len(agents), base.shape[0]
    acc = np.zeros((nparts, n, 2), np.int64)
    peak = np.zeros((nparts, n), np.float32)
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        tau = np.empty((n, BLOCK), np.float32)
        c = np.empty(BLOCK, np.int32)
        lanes = np.zeros((n, LANES), np.float32)
        bad = np.zeros((n, LANES), np.bool_)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            _widen(base, s, m, bb)
            for j in range(m):
                c[j] = 0
            for t in range(n):
                _taus(agents[t], s, m, bb, tau[t], lanes[t], bad[t])
                for j in range(m):
                    c[j] += 1 if abs(tau[t, j]) > eps else 0
            for t in range(n):
                sh = 0
                un = 0
                for j in range(m):
                    act = abs(tau[t, j]) > eps
                    sh += 1 if act and c[j] >= 2 else 0
                    un += 1 if act and c[j] == 1 else 0
                acc[p, t, 0] += sh
                acc[p, t, 1] += un
        for t in range(n):
            peak[p, t] = _fold_peak(lanes[t], bad[t])
    return acc.sum(axis=0), peak


def overlap_counts(base, agents, eps, nparts):
    """Per-agent shared and unique counts (N, 2) of one chunk, for tensor-local ρ."""
    return count_and_peak(base, agents, eps, nparts)[0]


@nb.njit(inline="always")
def _bucket(a, lad, L):
    """Number of ladder values below a (the ladder padded with +inf to 8 values: eight compares
    without a loop), L for NaN."""
    k = (np.int32(lad[0] < a) + np.int32(lad[1] < a) + np.int32(lad[2] < a) + np.int32(lad[3] < a)
         + np.int32(lad[4] < a) + np.int32(lad[5] < a) + np.int32(lad[6] < a) + np.int32(lad[7] < a))
    return np.int32(L) if a != a else k


@nb.njit(parallel=True, cache=True, nogil=True)
def overlap_histogram(base, agents, ladder, fractions, nparts):
    """Joint-state counts for the analysis pass (see analysis/ladder.py); Σ τ_t² per agent and joint state
    (N, states) and Σ τ_a·τ_b per pair of agents (a < b, in order) and joint state (P, states): the same sums
    as the torch path's weighted histograms, which decode into every ε's norms and shared-region
    diagnostics; and the dominance tables (N, F, (L+1)²): Σ τ_t² by the interval [start, end) of ladder
    indices where t is active and shared and the active partners' Σ|τ| (float64, in agent order) is below
    fractions[f]·|τ_t| (analysis.ladder._dominance_tables).

    Block by block: the ladder buckets (k = number of ladder values below |τ|; NaN above all) and the joint
    code of every element in loops without branches; then the counts, into two interleaved tables (so that
    runs of one state do not wait on each other); then each agent's squares and each pair's products, added
    to its element's row of a (states, N + P) table, so that one element's sums share a cache line, while
    the two largest |τ| of each element are tracked; then the dominance intervals of the rare elements where
    one agent's |τ| is far above every other's. Ladders of up to 8 values (the default has 8) take eight
    compares per |τ|, longer ones a loop."""
    n, e = len(agents), base.shape[0]
    L = ladder.shape[0]
    F = 2  # fractions: (lower, higher)
    f0, f1 = fractions[0], fractions[1]  # ascending
    lad0 = np.float64(ladder[0])
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
    lad = np.full(8, np.inf, np.float32)
    lad[:min(L, 8)] = ladder[:min(L, 8)]
    counts = np.zeros((nparts, states), np.int64)
    sq = np.zeros((nparts, width, states), np.float64)
    dom = np.zeros((nparts, n, F, cells), np.float64)
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        cnt = np.zeros((2, states), np.int64)
        sqs = np.zeros((states, width), np.float64)
        dm = np.zeros((n, F, cells), np.float64)
        sqv = np.empty(BLOCK, np.float64)
        bb = np.empty(BLOCK, np.float32)
        code = np.empty(BLOCK, np.int32)
        tau = np.empty((n, BLOCK), np.float32)
        bk = np.empty(n, np.int32)  # the buckets of one (rare, dominated) element
        top1 = np.empty(BLOCK, np.float32)
        top2 = np.empty(BLOCK, np.float32)
        flag = np.empty(BLOCK, np.bool_)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            _widen(base, s, m, bb)
            for j in range(m):
                code[j] = 0
                top1[j] = _ZERO
                top2[j] = _ZERO
            mul = np.int32(1)
            for t in range(n):
                row = agents[t][s:s + m]
                tr = tau[t]
                if L <= 8:
                    for j in range(m):
                        x = load(row, j) - bb[j]
                        tr[j] = x
                        k = _bucket(abs(x), lad, L)
                        code[j] += (np.int32(2) * k + np.int32(x > _ZERO)) * mul
                        ax = abs(x)
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
                        code[j] += (np.int32(2) * k + np.int32(x > _ZERO)) * mul
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
            # Dominance. For ε indices before `end`, the partner with the largest |τ| is active, so the
            # partners' Σ|τ| is at least that |τ|: only the agent with the largest |τ| can be dominant, and
            # only where the runner-up is active at the smallest ε and below the higher fraction of it. Such
            # elements are rare; each is handled in registers (the torch path adds the others to cells that
            # decode to nothing).
            hits = 0
            for j in range(m):
                ok = (np.float64(top2[j]) > lad0) & (np.float64(top2[j]) < f1 * np.float64(top1[j]))
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
                        if L <= 8:
                            bk[o] = _bucket(a32, lad, L)
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
    total = sq.sum(axis=0)
    return counts.sum(axis=0), total[:n].copy(), total[n:].copy(), dom.sum(axis=0)


@nb.njit(parallel=True, cache=True, nogil=True)
def ram(base, agents, eps, lam, use_lam, out, peak):
    """RAM / RAM+ (Eq. 7): out = θ0 + τ_m (float32); per-agent max |τ| into `peak` (nparts, N).

    The same float32 operations as merging.methods.ram in the same order: the sum of the active τ_t
    (t ascending, from +0), λ_t·τ_t of the one active agent, the sum / c where c ≥ 2."""
    n, e = len(agents), base.shape[0]
    nparts = peak.shape[0]
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        tau = np.empty(BLOCK, np.float32)
        total = np.empty(BLOCK, np.float32)
        uniq = np.empty(BLOCK, np.float32)
        c = np.empty(BLOCK, np.int32)
        lanes = np.zeros((n, LANES), np.float32)
        bad = np.zeros((n, LANES), np.bool_)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            _widen(base, s, m, bb)
            for j in range(m):
                total[j] = _ZERO
                uniq[j] = _ZERO
                c[j] = 0
            for t in range(n):
                _taus(agents[t], s, m, bb, tau, lanes[t], bad[t])
                lt = lam[t]
                for j in range(m):
                    x = tau[j]
                    act = abs(x) > eps
                    c[j] += 1 if act else 0
                    total[j] += x if act else _ZERO  # adding +0 leaves the sum as it is
                    uniq[j] = lt * x if act else uniq[j]
            for j in range(m):
                k = c[j]
                mean = total[j] / np.float32(max(k, 1))
                one = uniq[j] if use_lam else total[j]
                # c = 0: torch adds a +0 sum here, turning a −0 base into +0
                out[s + j] = bb[j] + (_ZERO if k == 0 else (one if k == 1 else mean))
        for t in range(n):
            peak[p, t] = _fold_peak(lanes[t], bad[t])


@nb.njit(parallel=True, cache=True, nogil=True)
def linear(base, agents, scale, out, peak):
    """Task arithmetic / averaging: out = θ0 + (Σ_t τ_t)·scale."""
    n, e = len(agents), base.shape[0]
    nparts = peak.shape[0]
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        tau = np.empty(BLOCK, np.float32)
        total = np.empty(BLOCK, np.float32)
        lanes = np.zeros((n, LANES), np.float32)
        bad = np.zeros((n, LANES), np.bool_)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            _widen(base, s, m, bb)
            for j in range(m):
                total[j] = _ZERO  # torch's sum starts from +0, which matters only for signed zeros
            for t in range(n):
                _taus(agents[t], s, m, bb, tau, lanes[t], bad[t])
                for j in range(m):
                    total[j] += tau[j]
            for j in range(m):
                out[s + j] = bb[j] + total[j] * scale
        for t in range(n):
            peak[p, t] = _fold_peak(lanes[t], bad[t])


@nb.njit(inline="always")
def _mix(x):
    """splitmix64 finaliser on uint64 (wrapping), identical to merging.methods.dare.uniform."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@nb.njit(inline="always")
def _elect_mean_block(vals, n, m, out, s, bb, lam):
    """TIES sign election (zero sum elects +) and disjoint mean over the block's (n, m) values, as
    merging.methods.ties.elect_and_mean; out[s + j] = θ0 + mean·λ."""
    for j in range(m):
        total = _ZERO
        for t in range(n):
            total += vals[t, j]
        positive = total >= _ZERO
        agree = _ZERO
        count = 0
        for t in range(n):
            v = vals[t, j]
            ok = (v > _ZERO) if positive else (v < _ZERO)  # sign(v) equals the elected sign, v ≠ 0
            agree += v if ok else _ZERO
            count += 1 if ok else 0
        mean = _ZERO if count == 0 else agree / np.float32(max(count, 1))
        out[s + j] = bb[j] + mean * lam


@nb.njit(parallel=True, cache=True, nogil=True)
def dare(base, agents, keys, offset, p_drop, scale, lam, ties_mode, out, peak):
    """DARE+TA (ties_mode False) or DARE+TIES (True): drop by hashed uniforms, rescale, combine, × λ."""
    n, e = len(agents), base.shape[0]
    nparts = peak.shape[0]
    inv = np.float32(1.0 / (1 << 24))
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        tau = np.empty(BLOCK, np.float32)
        vals = np.empty((n, BLOCK), np.float32)
        lanes = np.zeros((n, LANES), np.float32)
        bad = np.zeros((n, LANES), np.bool_)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            _widen(base, s, m, bb)
            for t in range(n):
                _taus(agents[t], s, m, bb, tau, lanes[t], bad[t])
                kt = keys[t]
                for j in range(m):
                    x = _mix(np.uint64(offset + s + j) + kt)
                    r = np.float32((x >> np.uint64(40)) & np.uint64(0xFFFFFF)) * inv
                    vals[t, j] = (tau[j] * (_ONE if r >= p_drop else _ZERO)) * scale
            if ties_mode:
                _elect_mean_block(vals, n, m, out, s, bb, lam)
            else:
                for j in range(m):
                    total = _ZERO
                    for t in range(n):
                        total += vals[t, j]
                    out[s + j] = bb[j] + total * lam
        for t in range(n):
            peak[p, t] = _fold_peak(lanes[t], bad[t])


@nb.njit(parallel=True, cache=True, nogil=True)
def abs_bits_histogram(base, agents, fine, his, nparts):
    """TIES passes: per-partition, per-agent histogram (nparts, N, bins) of the high 16 bits of |τ|'s
    float32 pattern (coarse), or of the low 16 bits of the elements whose high bits equal his[t] (fine)."""
    n, e = len(agents), base.shape[0]
    bins = 65536 if fine else 32768
    acc = np.zeros((nparts, n, bins), np.int64)
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        key = np.empty(BLOCK, np.int32)
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            _widen(base, s, m, bb)
            for t in range(n):
                row = agents[t]
                h = acc[p, t]
                if fine:
                    c = 0
                    target = his[t]
                    for j in range(m):  # compact the low bits of the elements in the selected bin
                        bits = _f32_bits(abs(load(row, s + j) - bb[j]))
                        key[c] = bits & 0xFFFF
                        c += 1 if (bits >> 16) == target else 0
                    for i in range(c):
                        h[key[i]] += 1
                else:
                    for j in range(m):
                        key[j] = _f32_bits(abs(load(row, s + j) - bb[j])) >> 16
                    for j in range(0, m - 1, 2):
                        h[key[j]] += 1
                        h[key[j + 1]] += 1
                    if m % 2:
                        h[key[m - 1]] += 1
    return acc


@nb.njit(parallel=True, cache=True, nogil=True)
def _ties_partitions(base, agents, thr, keep_equal, first_rank, lam, out, peak):
    """TIES merge where partition p's first threshold-equal element of agent t has rank first_rank[p, t]."""
    n, e = len(agents), base.shape[0]
    nparts = peak.shape[0]
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        tau = np.empty(BLOCK, np.float32)
        vals = np.empty((n, BLOCK), np.float32)
        lanes = np.zeros((n, LANES), np.float32)
        bad = np.zeros((n, LANES), np.bool_)
        seen = first_rank[p].copy()
        for s in range(lo, hi, BLOCK):
            m = min(s + BLOCK, hi) - s
            _widen(base, s, m, bb)
            for t in range(n):
                _taus(agents[t], s, m, bb, tau, lanes[t], bad[t])
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
                    vals[t, j] = x * (_ONE if keep else _ZERO)
                seen[t] = st
            _elect_mean_block(vals, n, m, out, s, bb, lam)
        for t in range(n):
            peak[p, t] = _fold_peak(lanes[t], bad[t])


def ties_merge(base, agents, thresholds, keep_equal, first_rank, lam, out, peak):
    """TIES merge of one chunk: exact top-k trim with ties at the threshold kept in flat-index order,
    sign election, disjoint mean, × λ. `thresholds` are |τ| bit patterns (−1: keep all, int32 max:
    keep none); for non-negative floats, comparing values orders them as their bits do. Partition p
    (of peak.shape[0]) starts counting agent t's threshold-equal elements at first_rank[p, t], which
    the fine pass's per-partition histograms provide, so partitions run in parallel."""
    thr = thresholds.astype(np.int32).view(np.float32).copy()
    thr[thresholds < 0] = -1.0  # every |τ| ≥ 0 is above: keep all
    thr[thresholds == np.iinfo(np.int32).max] = np.inf  # no finite |τ| reaches it: keep none
    _ties_partitions(base, agents, thr, keep_equal, first_rank, lam, out, peak)


@nb.njit(cache=True, nogil=True)
def first_nonfinite(bits, exp_mask):
    """Index of the first NaN/Inf in a float array given as its unsigned bit patterns (all exponent
    bits set), or -1. Works for bf16/f16 (uint16), f32 (uint32) and f64 (uint64) with their mask."""
    n = bits.shape[0]
    for s in range(0, n, BLOCK):
        u = min(s + BLOCK, n)
        hit = False
        for i in range(s, u):  # a branch-free scan of the block first: almost always clean
            hit = hit | ((bits[i] & exp_mask) == exp_mask)
        if hit:
            for i in range(s, u):
                if bits[i] & exp_mask == exp_mask:
                    return i
    return -1


@nb.njit(cache=True, nogil=True)
def values_differ(a, b, magnitude_mask):
    """Whether two float arrays (as unsigned bit patterns, no NaN) hold different values; +0 equals −0."""
    n = a.shape[0]
    for s in range(0, n, BLOCK):
        u = min(s + BLOCK, n)
        hit = False
        for i in range(s, u):
            x = a[i]
            y = b[i]
            hit = hit | ((x != y) & (((x | y) & magnitude_mask) != 0))
        if hit:
            return True
    return False


# -- warm-up: dummy calls with the argument types the engine uses, so each kernel is loaded from numba's
# cache (or compiled into it) before the engine switches to it ------------------------------------------

def _dummies(dtype: str):
    raw = np.uint16 if dtype == "bf16" else np.float32
    stage = np.zeros((4, 8), raw)
    return stage[0], stage[1:], np.zeros(8, np.float32), np.zeros((1, 3), np.float32)


def _warm_calls(name: str, dtype: str):
    base, agents, out, peak = _dummies(dtype)
    ladder = np.zeros(8, np.float32)
    if name == "count_and_peak":
        return [(count_and_peak, (base, agents, np.float32(0), 1))]
    if name == "peak_abs_tau":
        return [(peak_abs_tau, (base, agents, 1))]
    if name == "overlap_histogram":
        return [(overlap_histogram, (base, agents, ladder, np.array([0.1, 0.3]), 1))]
    if name == "ram":
        return [(ram, (base, agents, np.float32(0), np.ones(3, np.float32), True, out, peak))]
    if name == "linear":
        return [(linear, (base, agents, np.float32(1), out, peak))]
    if name == "dare":
        return [(dare, (base, agents, np.zeros(3, np.uint64), 0, np.float32(0.5), np.float32(2), np.float32(1),
                        flag, out, peak)) for flag in (False, True)]
    if name == "abs_bits_histogram":
        return [(abs_bits_histogram, (base, agents, flag, np.zeros(3, np.int32), 1)) for flag in (False, True)]
    if name == "ties_merge":
        return [(_ties_partitions, (base, agents, np.zeros(3, np.float32), np.zeros(3, np.int64),
                                    np.zeros((1, 3), np.int64), np.float32(1), out, peak))]
    if name in ("first_nonfinite", "values_differ"):  # the output dtype's bit patterns
        calls = []
        for bits in (np.uint16, np.uint32, np.uint64):
            x = np.zeros(4, bits)
            calls.append((first_nonfinite, (x, bits(1))) if name == "first_nonfinite" else
                         (values_differ, (x, x, bits(1))))
        return calls if dtype == "bf16" else []
    raise KeyError(name)


def warm(name: str, dtype: str) -> bool:
    """Make kernel `name` ready for `dtype`; True if it had to be compiled (not found in the cache)."""
    fresh = False
    for fn, args in _warm_calls(name, dtype):
        before = sum(fn.stats.cache_misses.values())
        fn(*args)
        fresh |= sum(fn.stats.cache_misses.values()) > before
    return fresh


def mark_cached(dtype: str, kernel: str | None = None) -> None:
    """Note that every kernel of `dtype` (or the one `kernel`) is in numba's cache (see merging.kernels.prepare)."""
    from merging.kernels.marker import marker_path

    try:
        path = marker_path(dtype, kernel)
        if os.path.isdir(os.path.dirname(path)):
            with open(path, "w") as f:
                f.write("ready\n")
    except OSError:
        pass

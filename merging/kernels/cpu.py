"""The numba kernels.

Inputs are the stored values: `base` (E,) and `agents`, a tuple of N arrays (E,), either all bfloat16
(passed as uint16 bit patterns) or all float32. Each kernel splits E into a few partitions per thread
and walks each partition in small blocks: the block of every model is widened to float32 into buffers
that stay in cache, then every τ = agent − base is computed in float32 exactly like the torch path.
Literals are float32 on purpose: a float64 constant would silently change the arithmetic.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba.core import types
from numba.extending import overload

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
BLOCK = 16384


def parts(n: int) -> int:
    """How many independent partitions to split E elements into (a few per thread)."""
    return max(1, min(n // BLOCK + 1, nb.get_num_threads() * 4))


def hist_parts(n: int) -> int:
    """Partitions for kernels with a large private histogram each: one per thread at most."""
    return max(1, min(n // BLOCK + 1, nb.get_num_threads()))




def widen_block(raw, lo, hi, scratch):
    """Float32 view of raw[lo:hi] (bf16 bit patterns are widened into `scratch`)."""


@overload(widen_block, inline="always")
def _widen_block(raw, lo, hi, scratch):
    if raw.dtype == types.uint16:
        def impl(raw, lo, hi, scratch):
            n = hi - lo
            for j in range(n):
                scratch[j] = np.uint32(raw[lo + j]) << np.uint32(16)  # bfloat16 → float32 is exact
            return scratch[:n].view(np.float32)
        return impl
    if raw.dtype == types.float32:
        def impl(raw, lo, hi, scratch):
            return raw[lo:hi]
        return impl
    return None


@nb.njit(inline="always")
def _load(base, agents, lo, hi, scratch):
    """Float32 blocks of base and of every agent for elements lo..hi."""
    b = widen_block(base, lo, hi, scratch[0])
    n = len(agents)
    out = np.empty((n, hi - lo), np.float32)
    for t in range(n):
        out[t] = widen_block(agents[t], lo, hi, scratch[t + 1])
    return b, out


@nb.njit(inline="always")
def _span(e, nparts, p):
    return p * e // nparts, (p + 1) * e // nparts


@nb.njit(inline="always")
def _note_peak(peak, p, t, a):
    """Running max |τ| that keeps a NaN once seen (like torch.amax)."""
    m = peak[p, t]
    if m == m and not a <= m:
        peak[p, t] = a


@nb.njit(parallel=True, cache=True, nogil=True)
def peak_abs_tau(base, agents, nparts):
    """Per-partition, per-agent max |τ| (N, nparts)."""
    n, e = len(agents), base.shape[0]
    peak = np.zeros((nparts, n), np.float32)
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        scratch = np.empty((n + 1, BLOCK), np.uint32)
        for s in range(lo, hi, BLOCK):
            u = min(s + BLOCK, hi)
            b, a = _load(base, agents, s, u, scratch)
            for t in range(n):
                for j in range(u - s):
                    _note_peak(peak, p, t, abs(a[t, j] - b[j]))
    return peak


@nb.njit(parallel=True, cache=True, nogil=True)
def overlap_histogram(base, agents, ladder, nparts):
    """Joint-state counts for the analysis pass (see analysis/overlap.py), and Σ τ_t² binned by
    (k_t, max_{s≠t} k_s) — agent t's ladder bucket and the highest bucket of any other agent — which is
    all the unique/shared norms need (t is unique at ε_j iff k_t > j ≥ that max) in a table that stays
    in L1 cache, instead of one per joint state."""
    n, e = len(agents), base.shape[0]
    L = ladder.shape[0]
    s_ = 2 * (L + 1)
    states = s_ ** n
    counts = np.zeros((nparts, states), np.int64)
    sq = np.zeros((nparts, n, (L + 1) * (L + 1)), np.float64)
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        scratch = np.empty((n + 1, BLOCK), np.uint32)
        ks = np.empty(n, np.int64)
        for s in range(lo, hi, BLOCK):
            u = min(s + BLOCK, hi)
            b, a = _load(base, agents, s, u, scratch)
            for j in range(u - s):
                code = 0
                mul = 1
                for t in range(n):
                    tau = a[t, j] - b[j]
                    x = abs(tau)
                    k = 0
                    if x != x:
                        k = L  # NaN sorts above every ε, as in torch.searchsorted
                    else:
                        while k < L and ladder[k] < x:
                            k += 1
                    ks[t] = k
                    code += (2 * k + (1 if tau > _ZERO else 0)) * mul
                    mul *= s_
                counts[p, code] += 1
                for t in range(n):
                    tau64 = np.float64(a[t, j] - b[j])
                    if tau64 != 0.0:  # most elements of a sparse agent: nothing to add
                        m = 0
                        for q in range(n):
                            if q != t and ks[q] > m:
                                m = ks[q]
                        sq[p, t, ks[t] * (L + 1) + m] += tau64 * tau64
    return counts.sum(axis=0), sq.sum(axis=0)


@nb.njit(parallel=True, cache=True, nogil=True)
def ram(base, agents, eps, lam, use_lam, out, peak):
    """RAM / RAM+ (Eq. 7): out = θ0 + τ_m (float32); per-agent max |τ| into `peak` (nparts, N)."""
    n, e = len(agents), base.shape[0]
    nparts = peak.shape[0]
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        scratch = np.empty((n + 1, BLOCK), np.uint32)
        for s in range(lo, hi, BLOCK):
            u = min(s + BLOCK, hi)
            b, a = _load(base, agents, s, u, scratch)
            for j in range(u - s):
                b0 = b[j]
                c = 0
                total = _ZERO
                uniq = _ZERO
                for t in range(n):
                    tau = a[t, j] - b0
                    x = abs(tau)
                    _note_peak(peak, p, t, x)
                    if x > eps:
                        c += 1
                        total += tau
                        uniq = lam[t] * tau
                if c == 0:
                    out[s + j] = b0 + _ZERO  # torch adds a +0 sum here, turning a −0 base into +0
                elif c == 1:
                    out[s + j] = b0 + (uniq if use_lam else total)
                else:
                    out[s + j] = b0 + total / np.float32(c)


@nb.njit(parallel=True, cache=True, nogil=True)
def overlap_counts(base, agents, eps, nparts):
    """Per-agent shared and unique counts (N, 2) of one chunk, for tensor-local ρ."""
    n, e = len(agents), base.shape[0]
    acc = np.zeros((nparts, n, 2), np.int64)
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        scratch = np.empty((n + 1, BLOCK), np.uint32)
        active = np.empty(n, np.bool_)
        for s in range(lo, hi, BLOCK):
            u = min(s + BLOCK, hi)
            b, a = _load(base, agents, s, u, scratch)
            for j in range(u - s):
                c = 0
                for t in range(n):
                    active[t] = abs(a[t, j] - b[j]) > eps
                    c += active[t]
                if c == 0:
                    continue
                col = 0 if c >= 2 else 1
                for t in range(n):
                    if active[t]:
                        acc[p, t, col] += 1
    return acc.sum(axis=0)


@nb.njit(parallel=True, cache=True, nogil=True)
def linear(base, agents, scale, out, peak):
    """Task arithmetic / averaging: out = θ0 + (Σ_t τ_t)·scale."""
    n, e = len(agents), base.shape[0]
    nparts = peak.shape[0]
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        scratch = np.empty((n + 1, BLOCK), np.uint32)
        for s in range(lo, hi, BLOCK):
            u = min(s + BLOCK, hi)
            b, a = _load(base, agents, s, u, scratch)
            for j in range(u - s):
                b0 = b[j]
                total = _ZERO  # torch's sum starts from +0, which matters only for signed zeros
                for t in range(n):
                    tau = a[t, j] - b0
                    _note_peak(peak, p, t, abs(tau))
                    total += tau
                out[s + j] = b0 + total * scale


@nb.njit(inline="always")
def _mix(x):
    """splitmix64 finaliser on uint64 (wrapping), identical to merging.methods.dare.uniform."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@nb.njit(inline="always")
def _elect_mean(vals):
    """TIES sign election (zero sum elects +) and disjoint mean, as merging.methods.ties.elect_and_mean."""
    n = vals.shape[0]
    total = _ZERO
    for t in range(n):
        total += vals[t]
    positive = total >= _ZERO
    agree_sum = _ZERO
    count = 0
    for t in range(n):
        v = vals[t]
        if (v > _ZERO) if positive else (v < _ZERO):  # sign(v) equals the elected sign, v ≠ 0
            agree_sum += v
            count += 1
    if count == 0:
        return _ZERO
    return agree_sum / np.float32(count)


@nb.njit(parallel=True, cache=True, nogil=True)
def dare(base, agents, keys, offset, p_drop, scale, lam, ties_mode, out, peak):
    """DARE+TA (ties_mode False) or DARE+TIES (True): drop by hashed uniforms, rescale, combine, × λ."""
    n, e = len(agents), base.shape[0]
    nparts = peak.shape[0]
    inv = np.float32(1.0 / (1 << 24))
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        scratch = np.empty((n + 1, BLOCK), np.uint32)
        vals = np.empty(n, np.float32)
        for s in range(lo, hi, BLOCK):
            u = min(s + BLOCK, hi)
            b, a = _load(base, agents, s, u, scratch)
            for j in range(u - s):
                b0 = b[j]
                for t in range(n):
                    tau = a[t, j] - b0
                    _note_peak(peak, p, t, abs(tau))
                    x = _mix(np.uint64(offset + s + j) + keys[t])
                    r = np.float32((x >> np.uint64(40)) & np.uint64(0xFFFFFF)) * inv
                    vals[t] = (tau * (_ONE if r >= p_drop else _ZERO)) * scale
                if ties_mode:
                    out[s + j] = b0 + _elect_mean(vals) * lam
                else:
                    total = _ZERO
                    for t in range(n):
                        total += vals[t]
                    out[s + j] = b0 + total * lam


@nb.njit(parallel=True, cache=True, nogil=True)
def abs_bits_histogram(base, agents, fine, his, nparts):
    """TIES passes: per-partition, per-agent histogram (nparts, N, bins) of the high 16 bits of |τ|'s
    float32 pattern (coarse), or of the low 16 bits of the elements whose high bits equal his[t] (fine)."""
    n, e = len(agents), base.shape[0]
    bins = 65536 if fine else 32768
    acc = np.zeros((nparts, n, bins), np.int64)
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        scratch = np.empty((n + 1, BLOCK), np.uint32)
        mag = np.empty(BLOCK, np.float32)
        bits = mag.view(np.int32)
        for s in range(lo, hi, BLOCK):
            u = min(s + BLOCK, hi)
            b, a = _load(base, agents, s, u, scratch)
            for t in range(n):
                for j in range(u - s):
                    mag[j] = abs(a[t, j] - b[j])
                for j in range(u - s):
                    if fine:
                        if (bits[j] >> 16) == his[t]:
                            acc[p, t, bits[j] & 0xFFFF] += 1
                    else:
                        acc[p, t, bits[j] >> 16] += 1
    return acc


@nb.njit(parallel=True, cache=True, nogil=True)
def _ties_partitions(base, agents, thr, keep_equal, first_rank, lam, out, peak):
    """TIES merge where partition p's first threshold-equal element of agent t has rank first_rank[p, t]."""
    n, e = len(agents), base.shape[0]
    nparts = peak.shape[0]
    for p in nb.prange(nparts):
        lo, hi = _span(e, nparts, p)
        scratch = np.empty((n + 1, BLOCK), np.uint32)
        vals = np.empty(n, np.float32)
        seen = first_rank[p].copy()
        for s in range(lo, hi, BLOCK):
            u = min(s + BLOCK, hi)
            b, a = _load(base, agents, s, u, scratch)
            for j in range(u - s):
                b0 = b[j]
                for t in range(n):
                    tau = a[t, j] - b0
                    x = abs(tau)
                    _note_peak(peak, p, t, x)
                    keep = x > thr[t]
                    if x == thr[t]:
                        seen[t] += 1
                        keep = seen[t] <= keep_equal[t]
                    vals[t] = tau * (_ONE if keep else _ZERO)
                out[s + j] = b0 + _elect_mean(vals) * lam


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
    for i in range(bits.shape[0]):
        if bits[i] & exp_mask == exp_mask:
            return i
    return -1


@nb.njit(cache=True, nogil=True)
def values_differ(a, b, magnitude_mask):
    """Whether two float arrays (as unsigned bit patterns, no NaN) hold different values; +0 equals −0."""
    for i in range(a.shape[0]):
        x = a[i]
        y = b[i]
        if x != y and ((x & magnitude_mask) != 0 or (y & magnitude_mask) != 0):
            return True
    return False

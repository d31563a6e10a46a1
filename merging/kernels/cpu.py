"""The numba kernels. Inputs are float32 arrays: `base` (E,) and `agents` (N, E), both as stored values
converted to float32; every τ is computed here as agents[t, i] − base[i] in float32, like the torch path.
Literals are float32 on purpose: a float64 constant would silently change the arithmetic."""
from __future__ import annotations

import numba as nb
import numpy as np

F32 = np.float32
_ZERO = np.float32(0.0)


def blocks(n: int) -> int:
    """How many independent blocks to split E elements into (a few per thread)."""
    return max(1, min(n, nb.get_num_threads() * 4))


@nb.njit(parallel=True, cache=True, nogil=True)
def overlap_histogram(base, agents, ladder, nblk):
    """Joint-state histogram (counts and Σ τ_t² per state) for the analysis pass (see analysis/overlap.py)."""
    n, e = agents.shape
    L = ladder.shape[0]
    s = 2 * (L + 1)
    states = s ** n
    counts = np.zeros((nblk, states), np.int64)
    sq = np.zeros((nblk, n, states), np.float64)
    for blk in nb.prange(nblk):
        lo = blk * e // nblk
        hi = (blk + 1) * e // nblk
        for i in range(lo, hi):
            b0 = base[i]
            code = 0
            mul = 1
            for t in range(n):
                tau = agents[t, i] - b0
                a = abs(tau)
                k = 0
                if a != a:
                    k = L  # NaN sorts above every ε, as in torch.searchsorted
                else:
                    while k < L and ladder[k] < a:
                        k += 1
                code += (2 * k + (1 if tau > _ZERO else 0)) * mul
                mul *= s
            counts[blk, code] += 1
            for t in range(n):
                tau = np.float64(agents[t, i] - b0)
                sq[blk, t, code] += tau * tau
    return counts.sum(axis=0), sq.sum(axis=0)


@nb.njit(parallel=True, cache=True, nogil=True)
def peak_abs_tau(base, agents, nblk):
    """Per-agent max |τ| (NaN wins, like torch.amax), used to refuse NaN/Inf and idle agents."""
    n, e = agents.shape
    acc = np.zeros((nblk, n), np.float32)
    for blk in nb.prange(nblk):
        lo = blk * e // nblk
        hi = (blk + 1) * e // nblk
        for t in range(n):
            m = _ZERO
            for i in range(lo, hi):
                a = abs(agents[t, i] - base[i])
                if not a <= m:  # true for a larger value and for NaN
                    m = a
                    if a != a:
                        break
            acc[blk, t] = m
    out = np.zeros(n, np.float32)
    for t in range(n):
        for blk in range(nblk):
            v = acc[blk, t]
            if out[t] != out[t]:
                break  # NaN already found: keep it
            if not v <= out[t]:
                out[t] = v
    return out


@nb.njit(parallel=True, cache=True, nogil=True)
def ram(base, agents, eps, lam, use_lam, out):
    """RAM / RAM+ (Eq. 7): out = θ0 + τ_m, written into `out` (float32)."""
    n, e = agents.shape
    for i in nb.prange(e):
        b0 = base[i]
        c = 0
        total = _ZERO
        uniq = _ZERO
        for t in range(n):
            tau = agents[t, i] - b0
            if abs(tau) > eps:
                c += 1
                total += tau
                uniq = lam[t] * tau
        if c == 0:
            out[i] = b0 + _ZERO  # torch adds a +0 sum here, which turns a −0 base into +0
        elif c == 1:
            out[i] = b0 + (uniq if use_lam else total)
        else:
            out[i] = b0 + total / np.float32(c)


@nb.njit(parallel=True, cache=True, nogil=True)
def overlap_counts(base, agents, eps, nblk):
    """Per-agent shared and unique counts (N, 2) of one chunk, for tensor-local ρ."""
    n, e = agents.shape
    acc = np.zeros((nblk, n, 2), np.int64)
    for blk in nb.prange(nblk):
        lo = blk * e // nblk
        hi = (blk + 1) * e // nblk
        for i in range(lo, hi):
            b0 = base[i]
            c = 0
            for t in range(n):
                if abs(agents[t, i] - b0) > eps:
                    c += 1
            if c == 0:
                continue
            col = 0 if c >= 2 else 1
            for t in range(n):
                if abs(agents[t, i] - b0) > eps:
                    acc[blk, t, col] += 1
    return acc.sum(axis=0)


@nb.njit(parallel=True, cache=True, nogil=True)
def linear(base, agents, scale, out):
    """Task arithmetic / averaging: out = θ0 + (Σ_t τ_t)·scale."""
    n, e = agents.shape
    for i in nb.prange(e):
        b0 = base[i]
        total = _ZERO  # torch's sum starts from +0, which matters only for signed zeros
        for t in range(n):
            total += agents[t, i] - b0
        out[i] = b0 + total * scale


@nb.njit(inline="always")
def _mix(x):
    """splitmix64 finaliser on uint64 (wrapping), identical to merging.methods.dare.uniform."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@nb.njit(parallel=True, cache=True, nogil=True)
def dare(base, agents, keys, offset, p, scale, lam, ties_mode, out):
    """DARE+TA (ties_mode False) or DARE+TIES (True): drop by hashed uniforms, rescale, combine, × λ."""
    n, e = agents.shape
    inv = np.float32(1.0 / (1 << 24))
    for i in nb.prange(e):
        b0 = base[i]
        vals = np.empty(n, np.float32)
        for t in range(n):
            tau = agents[t, i] - b0
            x = _mix(np.uint64(offset + i) + keys[t])
            u = np.float32((x >> np.uint64(40)) & np.uint64(0xFFFFFF)) * inv
            keep = np.float32(1.0) if u >= p else _ZERO
            vals[t] = (tau * keep) * scale
        if ties_mode:
            out[i] = b0 + _elect_mean(vals) * lam
        else:
            total = _ZERO
            for t in range(n):
                total += vals[t]
            out[i] = b0 + total * lam


@nb.njit(inline="always")
def _elect_mean(vals):
    """TIES sign election (zero sum elects +) and disjoint mean, as merging.methods.ties.elect_and_mean."""
    n = vals.shape[0]
    total = _ZERO
    for t in range(n):
        total += vals[t]
    elected = np.float32(1.0) if total >= _ZERO else np.float32(-1.0)
    agree_sum = _ZERO
    count = 0
    for t in range(n):
        v = vals[t]
        if v != _ZERO and np.sign(v) == elected:
            agree_sum += v
            count += 1
    if count == 0:
        return _ZERO
    return agree_sum / np.float32(count)


@nb.njit(parallel=True, cache=True, nogil=True)
def abs_bits_histogram(base, agents, fine, his, nblk):
    """TIES passes: per-agent histogram of the high 16 bits of |τ|'s float32 pattern (coarse), or of the
    low 16 bits of the elements whose high bits equal his[t] (fine)."""
    n, e = agents.shape
    bins = 65536 if fine else 32768
    acc = np.zeros((nblk, n, bins), np.int64)
    for blk in nb.prange(nblk):
        lo = blk * e // nblk
        hi = (blk + 1) * e // nblk
        buf = np.empty(hi - lo, np.float32)
        bits = buf.view(np.int32)
        for t in range(n):
            for i in range(lo, hi):
                buf[i - lo] = abs(agents[t, i] - base[i])
            for j in range(hi - lo):
                if fine:
                    if (bits[j] >> 16) == his[t]:
                        acc[blk, t, bits[j] & 0xFFFF] += 1
                else:
                    acc[blk, t, bits[j] >> 16] += 1
    return acc.sum(axis=0)


@nb.njit(cache=True, nogil=True)
def ties_merge(base, agents, thresholds, keep_equal, seen_equal, lam, out):
    """TIES merge of one chunk: exact top-k trim (ties broken by flat index, hence sequential), sign
    election, disjoint mean, × λ. `seen_equal` carries the tie count from earlier chunks."""
    n, e = agents.shape
    step = 65536
    tau = np.empty((n, step), np.float32)
    mag = np.empty(step, np.float32)
    bits = mag.view(np.int32)
    vals = np.empty(n, np.float32)
    keep = np.empty((n, step), np.bool_)
    for lo in range(0, e, step):
        hi = min(lo + step, e)
        for t in range(n):
            for i in range(lo, hi):
                v = agents[t, i] - base[i]
                tau[t, i - lo] = v
                mag[i - lo] = abs(v)
            thr = thresholds[t]
            for j in range(hi - lo):
                if bits[j] > thr:
                    keep[t, j] = True
                elif bits[j] == thr:
                    seen_equal[t] += 1
                    keep[t, j] = seen_equal[t] <= keep_equal[t]
                else:
                    keep[t, j] = False
        for i in range(lo, hi):
            for t in range(n):
                vals[t] = tau[t, i - lo] * (np.float32(1.0) if keep[t, i - lo] else _ZERO)
            out[i] = base[i] + _elect_mean(vals) * lam

"""Every statistic of the analysis for many small tensors in one call, decoded per tensor in the kernel.

The joint-state histogram (statistics.overlap_histogram) costs a few nanoseconds per element but its decoding
costs O(states) per tensor (18³ states for three agents and eight ε): for a tensor of a few thousand elements
or fewer the decoding, and the Python around one kernel call per tensor, dwarf the elements. Here a batch of
tensors laid end to end (`starts`) is walked tensor by tensor, and each statistic is evaluated at each ε of the
ladder directly (the rule of the per-ε loop strategy, analysis.ladder.EpsLoopAccumulator), block by block in
loops without branches; an ε index is skipped once no agent is active at it. Tensors are independent, so
partitions of the batch never change a result.

Outputs, one row per tensor (zeroed by the caller):
  icnt (T, N, L, 5) int64: changed, shared, unique, sign conflicts, one-step changes
  hist (T, N, L, N) int64: hist[i, t, j, k-1] = elements changed by t and by exactly k agents
  fsum (T, N, L, 6) float64: Σ τ_t² on unique and on shared elements, Σ τ_t·o_t and Σ o_t² on shared elements
        (o_t: the other active agents' τ, summed in agent order), Σ τ² of the one-step changes, and the
        unique count independent masks would give within each binade of the base (analysis.precision)
  dom (T, N, L, F) float64: Σ τ_t² on shared elements where the active partners' Σ|τ| < fractions[f]·|τ_t|
  pint (T, P, L, 2) int64 and pflt (T, P, L, 3) float64, per pair (a < b): elements both changed, of which
        same sign; Σ τ_a·τ_b, Σ τ_a², Σ τ_b² there
  anyc (T, N) int64: elements whose stored value changed at all; below (T, L) int64: elements whose step at
  the base weight exceeds ε (with `steps`: every element where ladder[j] < 1); finite (T,) bool.
"""
from __future__ import annotations

import numpy as np

from merging.kernels.common import BLOCK, MAXF, ZERO, f32_bits, load, part_span, widen
from merging.kernels.numba_import import numba as nb
from merging.kernels.statistics import bucket, bucket_row, step_kind


@nb.njit(parallel=True, cache=True, nogil=True)
def tensor_stats(base, agents, starts, ladder, fractions, steps, thr, binmap, ulp, step64, hfield, nparts,
                 icnt, hist, fsum, dom, pint, pflt, anyc, below, finite):
    """Per-tensor statistics of the tensors [starts[i], starts[i+1]) of base (E,) and agents (N, E); see the
    module docstring for the outputs. `thr`, `binmap`, `ulp`, `step64`, `hfield` are the base's stored dtype's
    tables (analysis.precision.FormatTables)."""
    n = agents.shape[0]
    T = starts.shape[0] - 1
    L = ladder.shape[0]
    F = fractions.shape[0]
    npairs = n * (n - 1) // 2
    pa = np.empty(npairs, np.int64)
    pb = np.empty(npairs, np.int64)
    q = 0
    for ia in range(n):
        for ib in range(ia + 1, n):
            pa[q] = ia
            pb[q] = ib
            q += 1
    lad = np.full(8, np.inf, np.float32)
    lad[:min(L, 8)] = ladder[:min(L, 8)]
    for p in nb.prange(nparts):
        tlo, thi = part_span(T, nparts, p)
        bb = np.empty(BLOCK, np.float32)
        fld = np.empty(BLOCK, np.int32)
        tau = np.empty((n, BLOCK), np.float32)
        kk = np.empty((n, BLOCK), np.int32)
        act = np.empty((n, BLOCK), np.bool_)
        c = np.empty(BLOCK, np.int32)
        npos = np.empty(BLOCK, np.int32)
        nneg = np.empty(BLOCK, np.int32)
        hk = np.zeros(n, np.int64)
        bn = np.zeros(256, np.int64)  # elements per binade of the base (this tensor)
        bc = np.zeros((256, n, L + 1), np.int64)  # … by agent and ladder bucket
        touched = np.empty(256, np.int32)
        os_cnt = np.zeros((n, L + 1), np.int64)  # one-step changes by ladder bucket
        os_sq = np.zeros((n, L + 1), np.float64)
        for i in range(tlo, thi):
            lo, hi = starts[i], starts[i + 1]
            nt = 0
            ok = True
            for t in range(n):
                for k in range(L + 1):
                    os_cnt[t, k] = 0
                    os_sq[t, k] = 0.0
            for s in range(lo, hi, BLOCK):
                m = min(s + BLOCK, hi) - s
                widen(base, s, m, bb)
                for j in range(m):
                    f = (f32_bits(bb[j]) >> 23) & 0xFF
                    fld[j] = f
                    b = binmap[f]
                    if bn[b] == 0:
                        touched[nt] = b
                        nt += 1
                    bn[b] += 1
                kmax = 0
                for t in range(n):
                    row = agents[t]
                    for j in range(m):
                        x = load(row, s + j) - bb[j]
                        tau[t, j] = x
                        ax = abs(x)
                        f = fld[j]
                        if steps:
                            k = bucket_row(ax, thr, f, L)
                        elif L <= 8:
                            k = bucket(ax, lad, L)
                        else:
                            k = np.int32(0)
                            for e in range(L):
                                k += np.int32(ladder[e] < ax)
                            k = np.int32(L) if ax != ax else k
                        kk[t, j] = k
                        kmax = max(kmax, k)
                        ok &= ax <= MAXF
                        fb = f32_bits(bb[j])
                        kind = step_kind(x, ulp[f], ((fb & 0x7FFFFF) == 0) & (f > hfield), fb < 0)
                        bc[binmap[f], t, k] += 1
                        anyc[i, t] += np.int64(kind != 0)
                        if kind == 1 or kind == 2:
                            u = step64[f] if kind == 1 else step64[f] * 0.5
                            os_cnt[t, k] += 1
                            os_sq[t, k] += u * u
                for e in range(min(L, kmax)):
                    _at_eps(e, n, m, tau, kk, act, c, npos, nneg, hk, pa, pb, fractions, F, icnt[i], hist[i],
                            fsum[i], dom[i], pint[i], pflt[i])
            finite[i] = ok
            _close_tensor(i, n, L, nt, touched, bn, bc, os_cnt, os_sq, ladder, steps, step64, hi - lo,
                          icnt, fsum, below)


@nb.njit(inline="always")
def _at_eps(e, n, m, tau, kk, act, c, npos, nneg, hk, pa, pb, fractions, F, icnt, hist, fsum, dom, pint, pflt):
    """Add one block's statistics at ε index e (agent t active where its bucket exceeds e)."""
    for j in range(m):
        c[j] = 0
        npos[j] = 0
        nneg[j] = 0
    for t in range(n):
        for j in range(m):
            a = kk[t, j] > e
            act[t, j] = a
            c[j] += np.int32(a)
            up = tau[t, j] > ZERO
            npos[j] += np.int32(a & up)
            nneg[j] += np.int32(a & (not up))
    for t in range(n):
        ch = 0
        sh = 0
        un = 0
        cf = 0
        squ = 0.0
        sqs = 0.0
        dot = 0.0
        sqo = 0.0
        for k in range(n):
            hk[k] = 0
        for j in range(m):
            a = act[t, j]
            x = np.float64(tau[t, j])
            sq = x * x
            shared = a & (c[j] >= 2)
            unique = a & (c[j] == 1)
            ch += np.int64(a)
            sh += np.int64(shared)
            un += np.int64(unique)
            opp = nneg[j] > 0 if tau[t, j] > ZERO else npos[j] > 0
            cf += np.int64(shared & opp)
            squ += sq if unique else 0.0
            sqs += sq if shared else 0.0
            if a:
                hk[c[j] - 1] += 1
            if shared:
                o = 0.0
                ab = 0.0
                for s in range(n):
                    if s != t and act[s, j]:
                        xs = np.float64(tau[s, j])
                        o += xs
                        ab += abs(xs)
                dot += x * o
                sqo += o * o
                for f in range(F):
                    if ab < fractions[f] * abs(x):
                        dom[t, e, f] += sq
        icnt[t, e, 0] += ch
        icnt[t, e, 1] += sh
        icnt[t, e, 2] += un
        icnt[t, e, 3] += cf
        for k in range(n):
            hist[t, e, k] += hk[k]
        fsum[t, e, 0] += squ
        fsum[t, e, 1] += sqs
        fsum[t, e, 2] += dot
        fsum[t, e, 3] += sqo
    for q in range(pa.shape[0]):
        ia = pa[q]
        ib = pb[q]
        both = 0
        agree = 0
        dot = 0.0
        sqa = 0.0
        sqb = 0.0
        for j in range(m):
            w = act[ia, j] & act[ib, j]
            xa = np.float64(tau[ia, j])
            xb = np.float64(tau[ib, j])
            both += np.int64(w)
            agree += np.int64(w & ((tau[ia, j] > ZERO) == (tau[ib, j] > ZERO)))
            dot += xa * xb if w else 0.0
            sqa += xa * xa if w else 0.0
            sqb += xb * xb if w else 0.0
        pint[q, e, 0] += both
        pint[q, e, 1] += agree
        pflt[q, e, 0] += dot
        pflt[q, e, 1] += sqa
        pflt[q, e, 2] += sqb


@nb.njit(inline="always")
def _close_tensor(i, n, L, nt, touched, bn, bc, os_cnt, os_sq, ladder, steps, step64, numel, icnt, fsum, below):
    """A tensor's one-step counts and sums for every ε, its chance unique counts within binades and its
    elements whose step exceeds ε, from the per-binade and per-bucket tables; then those tables are cleared."""
    for t in range(n):
        cnt = 0
        sq = 0.0
        for k in range(L, 0, -1):  # ε index k−1 counts the buckets above it
            cnt += os_cnt[t, k]
            sq += os_sq[t, k]
            icnt[i, t, k - 1, 4] = cnt
            fsum[i, t, k - 1, 4] = sq
    order = np.sort(touched[:nt])
    ch = np.empty((n, L), np.float64)
    for r in range(nt):
        b = order[r]
        for t in range(n):
            run = 0
            for k in range(L, 0, -1):
                run += bc[b, t, k]
                ch[t, k - 1] = run
        for e in range(L):
            for t in range(n):
                keep = 1.0
                for s in range(n):
                    if s != t:
                        keep *= 1.0 - ch[s, e] / bn[b]
                fsum[i, t, e, 5] += ch[t, e] * keep
            if not steps:
                below[i, e] += bn[b] if step64[b] > np.float64(ladder[e]) else 0
        bn[b] = 0
        for t in range(n):
            for k in range(L + 1):
                bc[b, t, k] = 0
    if steps:
        for e in range(L):
            below[i, e] = numel if ladder[e] < 1.0 else 0

"""What every numba kernel shares: the conventions, the partitions, and the inline helpers.

Inputs are the stored values: `base` (E,) and `agents` (N, E) (or a tuple of N arrays), either all
bfloat16 (passed as uint16 bit patterns) or all float32. Each kernel splits E into partitions (a fixed
number for a given E, so results never depend on the thread count) and walks each partition in blocks
that stay in L1 cache: τ = agent − base is formed in float32 exactly like the torch path (a bf16 value
widens to float32 by a 16-bit shift of its bits, done in registers), one agent at a time over the block
in loops without branches that the compiler vectorises, and the per-element decision is taken with
selects, not jumps: the agents' updates are random-looking, so a branch per element mispredicts often.
Literals are float32 on purpose: a float64 constant would silently change the arithmetic.

The kernels live in one module per method (ram, linear, dare, ties), the statistics scans in
`statistics`, the output checks in `guards`, their warm-up calls in `warm`. numba's cache keys each
kernel on its own file only, but the helpers here are inlined into the kernels: the warm-up markers
(`marker.py`) are stamped over every kernel source file, this one included, and the first warm-up after any
of them changed empties numba's index of each kernel before loading it (`warm._forget_stale_cache`), so a
kernel is never loaded compiled from old helpers.
"""
from __future__ import annotations

import llvmlite.ir as ir
import numpy as np

from merging.kernels.numba_import import intrinsic, overload, types
from merging.kernels.numba_import import numba as nb

ZERO = np.float32(0.0)
ONE = np.float32(1.0)
MAXF = np.float32(3.4028235e38)
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
def bf16_to_f32(typingctx, x):
    """The float32 value of a bfloat16 bit pattern: its 16 bits become the high half (exact)."""
    if x != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def f32_bits(typingctx, x):
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
            return bf16_to_f32(raw[i])
        return impl
    if raw.dtype == types.float32:
        def impl(raw, i):
            return raw[i]
        return impl
    return None


@nb.njit(inline="always")
def part_span(e, nparts, p):
    return p * e // nparts, (p + 1) * e // nparts


@nb.njit(inline="always")
def widen(base, s, m, bb):
    """bb[:m] = float32 base[s:s+m]."""
    for j in range(m):
        bb[j] = load(base, s + j)


@nb.njit(inline="always")
def tau_block(row, s, m, bb, tau, lanes, bad):
    """tau[:m] = float32 row[s:s+m] − bb[:m]; running max |τ| in `lanes`, non-finite |τ| noted in `bad`."""
    for j0 in range(0, m - m % LANES, LANES):
        for q in range(LANES):
            x = load(row, s + j0 + q) - bb[j0 + q]
            tau[j0 + q] = x
            a = abs(x)
            lanes[q] = max(lanes[q], a)
            bad[q] = bad[q] | (a != a) | (a > MAXF)
    for j in range(m - m % LANES, m):
        x = load(row, s + j) - bb[j]
        tau[j] = x
        a = abs(x)
        lanes[0] = max(lanes[0], a)
        bad[0] = bad[0] | (a != a) | (a > MAXF)


@nb.njit(inline="always")
def fold_peak(lanes, bad):
    """Max over lanes; NaN when any |τ| was NaN or infinite (check_finite then names where)."""
    m = ZERO
    b = False
    for q in range(LANES):
        m = max(m, lanes[q])
        b |= bad[q]
    return np.float32(np.nan) if b else m


@nb.njit(inline="always")
def exponent_field(x):
    """The float32 exponent field (0…255) of a float32 value."""
    return (f32_bits(x) >> 23) & 0xFF


@nb.njit(inline="always")
def block_thresholds(bb, m, eps, thr, steps, th):
    """th[:m] = each element's change threshold: ε, or with `steps` the step rule's threshold at the base
    weight, thr[exponent field of bb[j]] (merging.methods.steps.step_thresholds)."""
    if steps:
        for j in range(m):
            th[j] = thr[exponent_field(bb[j])]
    else:
        for j in range(m):
            th[j] = eps

"""Output checks: the first NaN/Inf of an output chunk, and whether it differs from the base.
"""
from __future__ import annotations

from merging.kernels.common import BLOCK
from merging.kernels.numba_import import numba as nb


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

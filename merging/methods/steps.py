"""Representable steps of a stored float dtype: the step rule (our extension of Eq. 1) and the tables the
precision statistics and the kernels share.

A float format with p stored mantissa bits spaces its values 2^(e−p) apart within the binade [2^e, 2^(e+1));
zeros and subnormals share the spacing of the smallest normal binade, 2^(emin−p). One **step** at a base
weight w is the spacing of the binade of |w| (a move toward zero from an exact power of two, 2^e with
e > emin, is half a step). Everything is indexed by the float32 exponent field (0…255) of w widened to float32,
exact for every stored float dtype the pass reads (F64 is read as float32 like everywhere in the pass, so its
steps are float32's); fields at or below the format's smallest normal binade map to that binade.

The step rule: an element counts as changed when |τ| > K steps of the base's stored dtype at the base weight,
compared exactly (|τ| > K·step in real numbers) through a float32 threshold rounded down (for a float32 |τ|,
|τ| > x ⇔ |τ| > RD32(x)). K = 0 is "the stored value changed at all".
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

# (stored mantissa bits p, smallest normal exponent emin) per safetensors float code.
FORMATS = {"BF16": (7, -126), "F16": (10, -14), "F32": (23, -126), "F64": (23, -126),
           "F8_E4M3": (3, -6), "F8_E5M2": (2, -14)}
FIELDS = 256  # float32 exponent fields
BIAS = 127


@dataclass(frozen=True)
class Steps:
    """The step rule at K steps (hashable: a key for counts, like an ε)."""

    k: float

    def __str__(self) -> str:
        return f"{self.k:g} steps"


def number_format(code: str) -> tuple[int, int]:
    """(p, emin) of a stored float dtype code; float32's for a code without one."""
    return FORMATS.get(code, FORMATS["F32"])


def min_field(code: str) -> int:
    """The float32 exponent field of the format's smallest normal binade (where zeros and subnormals go)."""
    return number_format(code)[1] + BIAS


@lru_cache(maxsize=64)
def _tables(code: str) -> tuple[np.ndarray, np.ndarray]:
    p, emin = number_format(code)
    fields = np.maximum(np.arange(FIELDS), emin + BIAS)
    return fields.astype(np.int32), np.ldexp(1.0, fields - BIAS - p)


def binade_map(code: str) -> np.ndarray:
    """(256,) int32: float32 exponent field → the binade it belongs to (a field; the clamp applied)."""
    return _tables(code)[0].copy()


def step_sizes(code: str) -> np.ndarray:
    """(256,) float64: one step (the binade's spacing) for each float32 exponent field of the base."""
    return _tables(code)[1].copy()


def round_down_f32(x: np.ndarray) -> np.ndarray:
    """Each float64 value rounded down to float32 (so that |τ| > x ⇔ |τ| > the result for float32 |τ|)."""
    with np.errstate(over="ignore"):
        y = x.astype(np.float32)
    above = y.astype(np.float64) > x
    y[above] = np.nextafter(y[above], np.float32(-np.inf))
    return y


def step_thresholds(ks, code: str) -> np.ndarray:
    """(len(ks), 256) float32: the threshold of K steps (each K rounded to float32) per exponent field."""
    k = np.asarray([float(np.float32(v)) for v in np.atleast_1d(ks)], np.float64)
    return round_down_f32(k[:, None] * step_sizes(code)[None, :])


def exponent_field(base: torch.Tensor) -> torch.Tensor:
    """The float32 exponent field (int64, 0…255) of float32 values."""
    return ((base.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.int64)


def thresholds(base: torch.Tensor, k: float, code: str) -> torch.Tensor:
    """The K-step threshold at each base weight (float32 `base` as stored values widened; same shape)."""
    table = torch.from_numpy(step_thresholds([k], code)[0]).to(base.device)
    return table[exponent_field(base)]


def changed_steps(taus: torch.Tensor, base: torch.Tensor, k: float, code: str) -> torch.Tensor:
    """m_t = |τ_t| > K steps at the base weight (the step rule), τ (N, E) and base (E,) in float32."""
    return taus.abs() > thresholds(base, k, code)

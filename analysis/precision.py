"""Precision statistics: what the number format of the stored weights does to "changed".

An RL update survives storage only where it exceeds the rounding of the stored value, and the step between
representable values depends on the base weight's binade (merging.methods.steps). The analysis pass therefore
counts, per agent and tensor, every element by (binade of |w_base| in the base's stored dtype, ladder bucket,
step kind) into one small table, (N, 256 × (L + 1) × 4) — filled by the fused kernel or by `precision_table`
(torch), in the same pass and from the same τ as every other statistic — and `decode` turns a batch of those
tables into, for every ε of the ladder at once:

- `chance_unique_binade`: the unique count independent random masks would give if each agent's changes
  were spread at random within each binade of each tensor (its own density there): Σ over the tensor's
  binades of changed_t·Π_{s≠t}(1 − d_s). Elements of one binade share one step size, so one rounding gate.
- `one_step`, `sq_one_step`: changed elements whose stored value is exactly one representable value away
  from the base's (adjacent values of the base's stored dtype), and their Σ τ² — exact from the counts,
  since |τ| of such an element is one step (or half a step, toward zero from a power of two).
- `changed_any`: elements whose stored value changed at all (τ ≠ 0), whatever ε.
- `eps_below_step`: elements whose step at the base weight exceeds ε (where ε passes every stored change).

Step kinds: 0 τ = 0; 1 one step; 2 one step toward zero from a power of two above the smallest normal binade
(half a step); 3 any other change (NaN included). Zeros and subnormals of the base share the smallest normal
binade (they have its step); −0 is 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from merging.methods.steps import FIELDS, binade_map, exponent_field, min_field, step_sizes, step_thresholds

KINDS = 4


@dataclass(frozen=True)
class FormatTables:
    """One stored dtype's tables for the pass: binade of each float32 exponent field, its step (float32 and
    float64), the smallest normal binade's field, and (ladder in steps) the ladder's thresholds per field."""

    code: str
    binmap: np.ndarray  # (256,) int32
    step32: np.ndarray  # (256,) float32
    step64: np.ndarray  # (256,) float64
    min_field: int
    thr: np.ndarray  # (256, max(L, 1)) float32: the step rule's thresholds per field (zeros for an ε ladder)


@lru_cache(maxsize=64)
def format_tables(code: str, ladder: tuple[float, ...], steps: bool) -> FormatTables:
    """The tables of stored dtype `code` for a ladder of ε values, or of step counts with `steps`."""
    thr = np.ascontiguousarray(step_thresholds(ladder, code).T) if steps else np.zeros((FIELDS, 1), np.float32)
    s64 = step_sizes(code)
    return FormatTables(code, binade_map(code), s64.astype(np.float32), s64, min_field(code), thr)


def table_width(L: int) -> int:
    """Entries of one agent's precision table."""
    return FIELDS * (L + 1) * KINDS


def step_buckets(mag: torch.Tensor, base: torch.Tensor, ft: FormatTables, L: int) -> torch.Tensor:
    """Ladder buckets in steps: the number of the ladder's step thresholds at each base weight below |τ|
    (`mag`, (N, E)); L for NaN (as an ε ladder's searchsorted puts it above every value)."""
    thr = torch.from_numpy(ft.thr[:, :L]).to(mag.device)[exponent_field(base)]  # (E, L)
    b = torch.zeros(mag.shape, dtype=torch.int64, device=mag.device)
    for j in range(L):
        b += mag > thr[:, j]
    return torch.where(torch.isnan(mag), L, b)


def precision_table(taus: torch.Tensor, base: torch.Tensor, buckets: torch.Tensor, ft: FormatTables,
                    L: int) -> torch.Tensor:
    """(N, table_width(L)) int64 counts by (binade of the base, ladder bucket, step kind) for τ (N, E) float32,
    the float32 base (E,) and the ladder buckets (N, E): what the fused kernel's precision table holds."""
    dev = taus.device
    bits = base.contiguous().view(torch.int32)
    f = exponent_field(base)
    step = torch.from_numpy(ft.step32).to(dev)[f]
    half_ok = ((bits & 0x7FFFFF) == 0) & (f > ft.min_field)
    toward = half_ok & ((taus < 0) != (bits < 0))
    one = taus.abs() == torch.where(toward, step * 0.5, step)
    kind = torch.where(taus == 0, 0, torch.where(one, 1 + toward.to(torch.int64), 3))
    binade = torch.from_numpy(ft.binmap.astype(np.int64)).to(dev)[f]
    key = (binade * (L + 1) + buckets) * KINDS + kind
    width = table_width(L)
    key = key + torch.arange(taus.shape[0], device=dev).view(-1, 1) * width
    return torch.bincount(key.reshape(-1), minlength=taus.shape[0] * width).view(taus.shape[0], width)


@dataclass
class PrecisionStats:
    """Decoded precision statistics of T tensors: arrays (T, N, L) unless noted (see the module docstring)."""

    changed_any: torch.Tensor  # int64, the same for every ε
    one_step: torch.Tensor  # int64
    sq_one_step: torch.Tensor  # float64
    chance_unique_binade: torch.Tensor  # float64: an expected count
    eps_below_step: torch.Tensor  # (T, L) int64

    def at(self, i: int) -> "PrecisionStats":
        """Tensor i's statistics (the leading axis dropped)."""
        return PrecisionStats(*(getattr(self, f)[i] for f in self.__dataclass_fields__))


def _above(x: torch.Tensor) -> torch.Tensor:
    """Σ over buckets k > j for each ε index j: (…, L + 1) → (…, L)."""
    return x.flip(-1).cumsum(-1).flip(-1)[..., 1:]


def decode(tables: list[torch.Tensor], fmts: list[FormatTables], ladder: tuple[float, ...],
           steps: bool) -> PrecisionStats:
    """The precision statistics of a batch of tensors from their tables (N, table_width(L)) and formats."""
    L = len(ladder)
    tab = torch.stack([t.cpu() for t in tables]).view(len(tables), -1, FIELDS, L + 1, KINDS)  # (T, N, B, K, 4)
    T, n = tab.shape[0], tab.shape[1]
    numel = tab[:, 0].sum((-1, -2))  # (T, B): elements per binade
    changed = _above(tab.sum(-1)).double()  # (T, N, B, L)
    dens = changed / numel.double().clamp(min=1).view(T, 1, FIELDS, 1)
    chance = torch.zeros(T, n, L, dtype=torch.float64)
    for t in range(n):
        keep = torch.ones(T, FIELDS, L, dtype=torch.float64)
        for s in range(n):
            if s != t:
                keep = keep * (1.0 - dens[:, s])
        chance[:, t] = (changed[:, t] * keep).sum(1)
    step = torch.from_numpy(np.stack([f.step64 for f in fmts])).view(T, 1, FIELDS, 1)  # (T, 1, B, 1)
    one, half = tab[..., 1], tab[..., 2]
    sq = (one.double() * step ** 2 + half.double() * (step / 2) ** 2).sum(2)  # (T, N, K)
    one_step = _above((one + half).sum(2))
    changed_any = tab[..., 1:].sum((2, 3, 4)).view(T, n, 1).expand(T, n, L).contiguous()
    if steps:  # ε in steps is below one step where K < 1
        below = (torch.tensor(ladder, dtype=torch.float64) < 1.0).view(1, L) * numel.sum(1, keepdim=True)
    else:
        eps = torch.tensor([float(np.float32(e)) for e in ladder], dtype=torch.float64)
        below = (numel.view(T, FIELDS, 1) * (step.view(T, FIELDS, 1) > eps.view(1, 1, L))).sum(1)
    return PrecisionStats(changed_any, one_step, _above(sq), chance, below.to(torch.int64))


def empty_table(n: int, L: int, device: torch.device | str) -> torch.Tensor:
    """A zeroed precision table for n agents."""
    return torch.zeros(n, table_width(L), dtype=torch.int64, device=device)

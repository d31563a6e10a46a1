"""Which elements each agent changed, which of those it shares and which are unique to it, and ρ_t, λ_t.

This module is the one statement of the paper's rule (Eq. 1-2, 6, 8): the merge methods, the global
counting pass, the analysis, the app and the demo all call it. The numba kernels in
`merging/kernels/` are a fused form of the same rule for the CPU, tested bit for bit against it.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from merging.methods.steps import Steps, changed_steps

RULES = ("clip", "soft")
# What decides "changed": an absolute ε (Eq. 1, a float) or the step rule (`Steps`, our extension).
Rule = float | Steps


def f32(x: float) -> float:
    """Round a scalar to float32: ε, p and λ are used as float32 values by both the torch and the
    kernel paths, so a comparison never depends on how a backend promotes a Python float."""
    return float(np.float32(x))


def changed(taus: torch.Tensor, eps: float) -> torch.Tensor:
    """m_t = |τ_t| > ε (Eq. 1), τ in float32 and ε rounded to float32."""
    return taus.abs() > f32(eps)


def changed_by(taus: torch.Tensor, rule: Rule, base: torch.Tensor | None = None,
               dtype: str = "F32") -> torch.Tensor:
    """m_t under `rule`: |τ_t| > ε, or |τ_t| > K steps of `dtype` at the base weight (float32 `base`, (E,),
    needed only then; τ (N, E))."""
    if isinstance(rule, Steps):
        if base is None:
            raise ValueError("the step rule needs the base weights")
        return changed_steps(taus, base, rule.k, dtype)
    return changed(taus, rule)


def rule_of(params: dict) -> Rule:
    """The region rule a method's parameters set: `eps_steps` > 0 is the step rule, else the absolute ε."""
    k = float(params.get("eps_steps") or 0.0)
    return Steps(k) if k > 0 else float(params["eps"])


def shared_and_unique(m: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From change masks m (agents along `dim`): the overlap count c = Σ_t m_t, and the masks of each
    agent's shared (m_t ∧ c ≥ 2) and unique (m_t ∧ c = 1) elements."""
    c = m.sum(dim, dtype=torch.int32, keepdim=True)
    return c.squeeze(dim), m & (c >= 2), m & (c == 1)


def masks(taus: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """m (N, ...) and c for task vectors `taus` (N, ...)."""
    m = changed(taus, eps)
    return m, m.sum(0, dtype=torch.int32)


def counts(taus: torch.Tensor, eps: Rule, base: torch.Tensor | None = None, dtype: str = "F32") -> torch.Tensor:
    """Shared and unique counts per agent over all of `taus` (N, ...): an (N, 2) int64 tensor (the step rule
    needs the float32 `base` of the same elements and its stored dtype)."""
    flat = taus.reshape(taus.shape[0], -1)
    _, shared, unique = shared_and_unique(changed_by(flat, eps, None if base is None else base.reshape(-1), dtype))
    return torch.stack([shared.sum(1), unique.sum(1)], 1).to(torch.int64)


def count_lists(counts_nx2: torch.Tensor) -> dict[str, list[int]]:
    """(N, 2) shared/unique counts as the {"shared": [...], "unique": [...]} lists methods take."""
    return {"shared": [int(v) for v in counts_nx2[:, 0]], "unique": [int(v) for v in counts_nx2[:, 1]]}


def rho(shared: int, unique: int) -> float:
    """Overlap-unique ratio ρ_t = shared_t / unique_t (Eq. 2); +∞ when unique is 0, 0 when nothing changed."""
    if unique > 0:
        return shared / unique
    return math.inf if shared > 0 else 0.0


def lambda_from_rho(rho_t: float, r: float, alpha: float | None, rule: str = "clip") -> float:
    """λ as a function of ρ: 1 + r·clip(ρ, 0, α) (Eq. 6) or 1 + r·ρ/(1+ρ) (Eq. 8, α unused)."""
    if rule == "soft":
        return 1.0 + r * (1.0 if math.isinf(rho_t) else rho_t / (1.0 + rho_t))
    return 1.0 + r * min(max(rho_t, 0.0), alpha)


def lambda_for(shared: int, unique: int, r: float, alpha: float | None, rule: str = "clip") -> float:
    """λ_t for one agent from its counts. An agent that changed nothing has λ_t = 1; with unique_t = 0
    and shared_t > 0 (ρ_t = +∞) the limits of Eq. 6 and 8 apply (λ_t then multiplies nothing)."""
    if shared + unique == 0:
        return 1.0
    if rule == "soft":  # Eq. 9: ρ/(1+ρ) = shared/(shared+unique), exact; the authors' script's order of operations
        return 1.0 + r * (shared / (shared + unique))
    return lambda_from_rho(rho(shared, unique), r, alpha, rule)


def lambdas_for(shared: Sequence[int], unique: Sequence[int], r: float, alpha: float | None,
                rule: str) -> list[float]:
    """λ_t for every agent."""
    return [lambda_for(int(s), int(u), r, alpha, rule) for s, u in zip(shared, unique)]


def chance_unique_share(densities: Sequence[float]) -> list[float]:
    """Unique share of each agent's changed elements if agents changed independent random sets of
    the given densities: Π_{j≠i}(1 − d_j). The yardstick that tells structure from chance."""
    out = []
    for i in range(len(densities)):
        share = 1.0
        for j, d in enumerate(densities):
            if j != i:
                share *= 1.0 - d
        out.append(share)
    return out

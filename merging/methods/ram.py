"""RAM and RAM+ (paper Sec. 4, Eq. 2 and 6-8): average where agents overlap, keep (and rescale) unique updates.

Choices where public implementations differ (see README "Maths and deviations"):
- ε is compared as |τ| > ε in float32, τ computed in float32 from the stored dtype (paper, Eq. 1).
- ρ_t is counted over the whole model by default (`rho_scope="global"`, the paper); `"tensor"` counts
  per tensor like mergekit's `ramplus_tl`.
- An agent that changed nothing has λ_t = 1. When unique_t = 0 and shared_t > 0, ρ_t = +∞, so the
  clip rule gives λ_t = 1 + r·α and the soft rule 1 + r (the limits of Eq. 6 and 8); λ_t then
  multiplies nothing, because the agent has no unique element. mergekit's ρ = shared/max(unique, ε)
  gives the same λ after clipping.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from . import register
from .base import ChunkContext, MergeMethod, Param, TensorPass, f32, non_negative

RULES = ("clip", "soft")
SCOPES = ("global", "tensor")


def rho(shared: int, unique: int) -> float:
    """Overlap-unique ratio ρ_t = shared_t / unique_t (Eq. 2); +∞ when unique is 0, 0 when nothing changed."""
    if unique > 0:
        return shared / unique
    return math.inf if shared > 0 else 0.0


def lambda_for(shared: int, unique: int, r: float, alpha: float, rule: str = "clip") -> float:
    """λ_t for one agent: 1 + r·clip(ρ_t, 0, α) (Eq. 6) or 1 + r·ρ_t/(1+ρ_t) (Eq. 8)."""
    if shared + unique == 0:
        return 1.0
    if rule == "soft":
        return 1.0 + r * shared / (shared + unique)  # Eq. 9: ρ/(1+ρ) = shared/(shared+unique)
    return 1.0 + r * min(max(rho(shared, unique), 0.0), alpha)


def lambdas_for(shared: Sequence[int], unique: Sequence[int], r: float, alpha: float, rule: str) -> list[float]:
    return [lambda_for(int(s), int(u), r, alpha, rule) for s, u in zip(shared, unique)]


def overlap_masks(taus: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """m_t = |τ_t| > ε (Eq. 1, ε as float32) and the overlap count c = Σ_t m_t."""
    m = taus.abs() > f32(eps)
    return m, m.sum(0, dtype=torch.int32)


def ram_combine(taus: torch.Tensor, eps: float, lam: torch.Tensor | None) -> torch.Tensor:
    """Selective merge (Eq. 7): 0 where c=0, λ_t·τ_t where only t is active, mean of active τ where c≥2."""
    m, c = overlap_masks(taus, eps)
    masked = taus * m
    total = masked.sum(0)
    unique = total if lam is None else (masked * lam.to(taus.dtype).view(-1, *([1] * (taus.dim() - 1)))).sum(0)
    # Where c == 1 only one term of `unique` is non-zero, so it is exactly λ_t·τ_t.
    return torch.where(c >= 2, total / c.clamp(min=1).to(taus.dtype), unique)


def _count_pass(eps_of: str = "eps") -> TensorPass:
    """Per-tensor shared/unique counts per agent, for tensor-local ρ (mergekit's ramplus_tl)."""

    def reduce(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
        m, c = overlap_masks(taus, ctx.params[eps_of])
        shared = (m & (c >= 2)).sum(1)
        unique = (m & (c == 1)).sum(1)
        return torch.stack([shared, unique], 1).to(torch.int64).cpu()

    def finish(total: torch.Tensor, ctx: ChunkContext) -> None:
        p = ctx.params
        lam = lambdas_for(total[:, 0].tolist(), total[:, 1].tolist(), p["r"], p.get("alpha", math.inf), p["rule"])
        ctx.state["lambda"] = torch.tensor(lam, dtype=torch.float64)
        ctx.state["counts"] = total

    def fused_reduce(base, agents, ctx: ChunkContext) -> torch.Tensor:
        from ..kernels import cpu

        return torch.from_numpy(cpu.overlap_counts(base, agents, np.float32(ctx.params[eps_of]), cpu.parts(base.size)))

    return TensorPass("overlap_counts", reduce, finish, fused_reduce)


def _merge(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    lam = ctx.state.get("lambda", ctx.shared.get("lambda"))
    if lam is not None and ctx.params.get("r", 0.0) == 0.0:
        lam = None
    return ram_combine(taus, ctx.params["eps"], None if lam is None else lam.to(taus.device))


def _fused(base, agents, ctx: ChunkContext, out, peak) -> None:
    """The same merge through the fused CPU kernel."""
    from ..kernels import cpu

    lam = ctx.state.get("lambda", ctx.shared.get("lambda"))
    use = lam is not None and ctx.params.get("r", 0.0) != 0.0
    lam32 = lam.numpy().astype(np.float32) if use else np.ones(len(agents), np.float32)
    cpu.ram(base, agents, np.float32(ctx.params["eps"]), lam32, use, out, peak)


def _passes(p: dict[str, Any]) -> tuple[TensorPass, ...]:
    return (_count_pass(),) if p.get("rho_scope") == "tensor" and p.get("r", 0) != 0 else ()


def _global_eps(p: dict[str, Any]) -> float | None:
    return p["eps"] if p.get("rho_scope") == "global" and p.get("r", 0) != 0 else None


def _prepare(p: dict[str, Any], counts: dict[str, list[int]] | None, agents: list[str]) -> dict[str, Any]:
    if counts is None:
        return {}
    lam = lambdas_for(counts["shared"], counts["unique"], p["r"], p.get("alpha", math.inf), p["rule"])
    return {"lambda": torch.tensor(lam, dtype=torch.float64)}


def _choice(options: tuple[str, ...]):
    return lambda v: None if v in options else f"must be one of {', '.join(options)}"


EPS = Param("eps", 1e-5, float, "Threshold ε: |τ| > ε counts as changed (paper: 1e-5).", non_negative)
R = Param("r", 0.1, float, "Rescale strength r of λ_t = 1 + r·clip(ρ_t, 0, α) (paper: 0.1).", non_negative)
ALPHA = Param("alpha", 2.0, float, "Clip bound α on ρ_t (paper: 2.0; mergekit ramplus_tl: 0.2).", non_negative)
SCOPE = Param("rho_scope", "global", str, "Count ρ_t over the whole model (global, paper) or per tensor.",
              _choice(SCOPES))


def _fixed(**values: Any) -> Param:
    """A hidden parameter pinned to one value (e.g. the λ rule of a variant)."""
    (name, value), = values.items()
    return Param(name, value, type(value), f"{name} is fixed to {value!r} for this method.",
                 lambda v, value=value: None if v == value else f"is fixed to {value!r} for this method")


register(MergeMethod(
    "ram", "RAM (Eq. 7): average overlapping updates, keep unique ones unchanged (RAM+ with r = 0).",
    _merge, (EPS,), fused=_fused))
register(MergeMethod(
    "ram_plus", "RAM+ (Eq. 6-7): RAM, with each agent's unique updates scaled by λ_t = 1 + r·clip(ρ_t, 0, α).",
    _merge, (EPS, R, ALPHA, SCOPE, _fixed(rule="clip")), _passes, _global_eps, _prepare, fused=_fused))
register(MergeMethod(
    "ram_plus_soft", "RAM+s (Eq. 8): unique updates scaled by λ_t = 1 + r·ρ_t/(1+ρ_t).",
    _merge, (EPS, R, SCOPE, _fixed(rule="soft")), _passes, _global_eps, _prepare, fused=_fused))

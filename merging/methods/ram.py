"""RAM and RAM+ (paper Sec. 4, Eq. 2 and 6-8): average where agents overlap, keep (and rescale) unique updates.

Choices where public implementations differ (see docs/methods.md, "Where our maths differs"):
- ε is compared as |τ| > ε in float32, τ computed in float32 from the stored dtype (paper, Eq. 1).
- `eps_steps` > 0 replaces ε by the step rule (our extension, merging/methods/steps.py): |τ| > K representable
  steps of the base's stored dtype at the base weight, for the regions and for ρ_t's counts alike.
- ρ_t is counted over the whole model by default (`rho_scope="global"`, the paper); `"tensor"` counts
  per tensor like mergekit's `ramplus_tl`.
- λ_t edge cases (no change; unique_t = 0) follow `merging.methods.regions.lambda_for`.
- Whole-model counts count each stored tensor once by default; `count_tied_twice` counts a tied embedding
  twice, as code counting over a loaded model's `state_dict()` does (the RAM authors' script).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from merging.methods import regions
from merging.methods.base import ChunkContext, MergeMethod, TensorPass
from merging.methods.mergekit_map import Mergekit, MergekitEquivalent, MergekitInput, MergekitRead
from merging.methods.params import EPS, Param
from merging.methods.registry import register
from merging.methods.steps import Steps, step_thresholds

SCOPES = ("global", "tensor")


def ram_combine(taus: torch.Tensor, eps: regions.Rule, lam: torch.Tensor | None, base: torch.Tensor | None = None,
                dtype: str = "F32") -> torch.Tensor:
    """Selective merge (Eq. 7): 0 where c=0, λ_t·τ_t where only t is active, mean of active τ where c≥2. Active:
    |τ| > ε, or under the step rule |τ| > K steps of `dtype` at the `base` weight (float32, (E,))."""
    m = regions.changed_by(taus, eps, base, dtype)
    c = m.sum(0, dtype=torch.int32)
    masked = taus * m
    total = masked.sum(0)
    unique = total if lam is None else (masked * lam.to(taus.dtype).view(-1, *([1] * (taus.dim() - 1)))).sum(0)
    # Where c == 1 only one term of `unique` is non-zero, so it is exactly λ_t·τ_t.
    return torch.where(c >= 2, total / c.clamp(min=1).to(taus.dtype), unique)


def _lambdas(rule: str, p: dict[str, Any], shared, unique) -> torch.Tensor:
    return torch.tensor(regions.lambdas_for(shared, unique, p["r"], p.get("alpha"), rule), dtype=torch.float64)


def _count_pass(rule: str) -> TensorPass:
    """Per-tensor shared/unique counts per agent, for tensor-local ρ (mergekit's ramplus_tl)."""

    def reduce(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
        return regions.counts(taus, regions.rule_of(ctx.params), ctx.base, ctx.dtype).cpu()

    def finish(total: torch.Tensor, ctx: ChunkContext) -> None:
        ctx.state["lambda"] = _lambdas(rule, ctx.params, total[:, 0].tolist(), total[:, 1].tolist())
        ctx.state["counts"] = total

    def fused_reduce(base, agents, ctx: ChunkContext) -> torch.Tensor:
        from merging.kernels.common import parts
        from merging.kernels.statistics import overlap_counts

        eps, thr, steps = _kernel_rule(ctx)
        return torch.from_numpy(overlap_counts(base, agents, eps, parts(base.size), thr, steps))

    return TensorPass("overlap_counts", reduce, finish, fused_reduce)


def _scales(ctx: ChunkContext) -> torch.Tensor | None:
    """λ_t for this tensor (tensor scope) or the model (global scope); None for plain RAM (r = 0)."""
    lam = ctx.state.get("lambda", ctx.shared.get("lambda"))
    return None if lam is None or ctx.params.get("r", 0.0) == 0.0 else lam


def _kernel_rule(ctx: ChunkContext) -> tuple[np.float32, np.ndarray, bool]:
    """The kernels' form of the region rule: (ε, the step thresholds per exponent field, whether steps rule)."""
    rule = regions.rule_of(ctx.params)
    if isinstance(rule, Steps):
        return np.float32(0), step_thresholds([rule.k], ctx.dtype)[0], True
    return np.float32(rule), np.zeros(256, np.float32), False


def _merge(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    lam = _scales(ctx)
    return ram_combine(taus, regions.rule_of(ctx.params), None if lam is None else lam.to(taus.device), ctx.base,
                       ctx.dtype)


def _fused(base, agents, ctx: ChunkContext, out, peak) -> None:
    """The same merge through the fused CPU kernel."""
    from merging.kernels.ram import ram

    lam = _scales(ctx)
    lam32 = lam.numpy().astype(np.float32) if lam is not None else np.ones(len(agents), np.float32)
    eps, thr, steps = _kernel_rule(ctx)
    ram(base, agents, eps, thr, steps, lam32, lam is not None, out, peak)


def _plus(rule: str) -> dict[str, Any]:
    """The hooks of RAM+ with λ rule `rule`: passes, global counts, λ_t from counts, overflow checks."""

    def passes(p: dict[str, Any]) -> tuple[TensorPass, ...]:
        return (_count_pass(rule),) if p["rho_scope"] == "tensor" and p["r"] != 0 else ()

    def global_eps(p: dict[str, Any]) -> regions.Rule | None:
        return regions.rule_of(p) if p["rho_scope"] == "global" and p["r"] != 0 else None

    def prepare(p: dict[str, Any], counts: dict[str, list[int]] | None, agents: list[str]) -> dict[str, Any]:
        return {} if counts is None else {"lambda": _lambdas(rule, p, counts["shared"], counts["unique"])}

    def factors(p: dict[str, Any]) -> dict[str, float]:
        return {"the largest λ_t, 1 + r·" + ("α" if rule == "clip" else "1"):
                1.0 + p["r"] * (p["alpha"] if rule == "clip" else 1.0)}

    return {"passes": passes, "global_counts_eps": global_eps, "prepare": prepare, "factors": factors}


R = Param("r", float, 0.1, "Rescale strength r of λ_t (paper: 0.1); r = 0 is plain RAM.", low=0.0, float32=True,
          step=0.01, label="r (rescale strength)")
ALPHA = Param("alpha", float, 2.0, "Clip bound α on ρ_t in λ_t = 1 + r·clip(ρ_t, 0, α) (paper: 2.0; mergekit "
              "ramplus_tl: 0.2).", low=0.0, float32=True, step=0.1, label="α (clip bound on ρ)")
EPS_STEPS = Param("eps_steps", float, 0.0, "Step rule (our extension, not in the paper or mergekit): when > 0, an "
                  "element counts as changed when |τ| exceeds this many representable steps of the base's stored "
                  "dtype at the base weight, instead of |τ| > ε; 0 keeps the paper's absolute ε.", low=0.0,
                  float32=True, step=0.5, label="ε in steps of the stored dtype (0: absolute ε)")
SCOPE = Param("rho_scope", str, "global", "Count ρ_t over the whole model (global, the paper) or per tensor "
              "(tensor, like mergekit's ramplus_tl).", choices=SCOPES, label="ρ scope")
COUNT_TIED = Param("count_tied_twice", bool, False,
                   "Count a tied embedding twice in the whole-model counts, as the loaded model's state_dict() lists "
                   "it (once more as lm_head.weight): the RAM authors' script counts so. Off: every stored tensor "
                   "once. Changes nothing for an untied model or per-tensor ρ.",
                   label="count tied ×2")


def counts_tied_twice(params: dict[str, Any]) -> bool:
    """Whether a method's parameters ask for whole-model counts over `state_dict()`, tied aliases included
    (`count_tied_twice`, as the RAM authors' script counts), rather than over the stored tensors once."""
    return bool(params.get(COUNT_TIED.name, False))


# ---------------------------------------------------------------- mergekit 0.1.5 (merge_methods/ram.py)
# ram: mean of active τ where ≥ 2 agents changed an element, τ_t where one did (`epsilon`, per tensor).
# ramplus_tl: ram with unique updates × 1 + r·clip(ρ_t, 0, α), ρ_t per tensor (`r` 0.1, `alpha` 0.2).

STEPS_NOTE = ("mergekit has no equivalent of the step rule (ε in representable steps of the stored dtype, "
              "eps_steps > 0): its epsilon is an absolute threshold. The nearest mergekit config, with ε, follows.")


def _ram_from_mergekit(c: MergekitInput) -> dict[str, Any]:
    c.no_weights()
    return {"eps": c.parameters["epsilon"]}


def _ram_plus_from_mergekit(c: MergekitInput) -> dict[str, Any]:
    c.no_weights()
    g = c.parameters
    return {"eps": g["epsilon"], "r": g["r"], "alpha": g["alpha"], "rho_scope": "tensor"}


def _ram_plus_to_mergekit(rule: str):
    """ramplus_tl when it computes the same merge (clip rule, per-tensor ρ); else the nearest, and why."""

    def write(p: dict[str, Any], n_agents: int) -> MergekitEquivalent:
        params = {"epsilon": p["eps"], "r": p["r"], "alpha": p.get("alpha", 2.0)}
        if p.get("eps_steps"):
            return MergekitEquivalent("ramplus_tl", params, exact=False, note=STEPS_NOTE)
        if rule == "clip" and p.get("rho_scope") == "tensor":
            return MergekitEquivalent("ramplus_tl", params)
        soft = "the soft rule λ_t = 1 + r·ρ_t/(1+ρ_t) and " if rule == "soft" else ""
        scope = "ρ_t counted over the whole model (global scope)" if p.get("rho_scope") == "global" else "this rule"
        return MergekitEquivalent("ramplus_tl", params, exact=False, note=(
            f"mergekit cannot express {soft}{scope}: its ramplus_tl counts ρ_t per tensor with the clip rule. "
            "The nearest mergekit config follows."))

    return write


def _ram_to_mergekit(p: dict[str, Any], n_agents: int) -> MergekitEquivalent:
    """mergekit's ram with the same ε; only the nearest config under the step rule."""
    if p.get("eps_steps"):
        return MergekitEquivalent("ram", {"epsilon": p["eps"]}, exact=False, note=STEPS_NOTE)
    return MergekitEquivalent("ram", {"epsilon": p["eps"]})


RAM_MERGEKIT = Mergekit(_ram_to_mergekit,
                        (MergekitRead("ram", {"epsilon": 1e-5}, frozenset(), _ram_from_mergekit),))
RAM_PLUS_MERGEKIT = Mergekit(_ram_plus_to_mergekit("clip"), (
    MergekitRead("ramplus_tl", {"epsilon": 1e-5, "r": 0.1, "alpha": 0.2}, frozenset(), _ram_plus_from_mergekit),))

register(MergeMethod(
    "ram", "RAM (Eq. 7): average overlapping updates, keep unique ones unchanged (RAM+ with r = 0).",
    _merge, (EPS, EPS_STEPS), fused=_fused, kernels=("ram",), mergekit=RAM_MERGEKIT))
register(MergeMethod(
    "ram_plus", "RAM+ (Eq. 6-7): RAM, with each agent's unique updates scaled by λ_t = 1 + r·clip(ρ_t, 0, α).",
    _merge, (EPS, R, ALPHA, SCOPE, COUNT_TIED, EPS_STEPS), fused=_fused, kernels=("ram", "count_and_peak"),
    mergekit=RAM_PLUS_MERGEKIT, **_plus("clip")))
register(MergeMethod(
    "ram_plus_soft", "RAM+s (Eq. 8): unique updates scaled by λ_t = 1 + r·ρ_t/(1+ρ_t).",
    _merge, (EPS, R, SCOPE, COUNT_TIED, EPS_STEPS), fused=_fused, kernels=("ram", "count_and_peak"),
    mergekit=Mergekit(_ram_plus_to_mergekit("soft")), **_plus("soft")))

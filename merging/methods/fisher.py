"""Fisher merging (Matena & Raffel 2022; the RAM paper's Table 1 baseline, App. D): each element's task
vectors averaged with each agent's diagonal Fisher information as its weight, then scaled,

    τ_m = Σ_t F'_t τ_t / Σ_t F'_t,   θ = θ0 + λ·τ_m,   F'_t = F_t + floor.

F_t is agent t's diagonal empirical Fisher on its own task (evaluation/fisher.py computes it and the engine
streams it here chunk by chunk, `ctx.side`). The floor is added to every F_t, as MergeLM and FusionBench add
their `minimal_fisher_weight` (1e-6 there and here): an element where every agent's Fisher is 0 then takes
the plain mean of the task vectors. With floor 0 such an element (0/0) takes the plain mean too, explicitly.
The parameters that say how F was computed (N examples, which answers) are the Fisher pass's; the merge
itself reads only λ and the floor. torch only: one multiply-add per agent and a division per element is
memory-bound, and a fused kernel would save little next to the Fisher pass itself (seconds to hours).
mergekit has no Fisher merging.
"""
from __future__ import annotations

import torch

from merging.common.errors import RamStudioError
from merging.methods.base import ChunkContext, MergeMethod
from merging.methods.params import LAMBDA, Param
from merging.methods.regions import f32
from merging.methods.registry import register

FISHER_RULES = ("sampled", "greedy", "reference")

FISHER_EXAMPLES = Param(
    "fisher_examples", int, 256, "N: examples of each agent's own task its diagonal Fisher is averaged over (paper's "
    "grid: 256, 512, 1024, 2048).", low=1, high=1_000_000, step=256, label="N (Fisher examples)")
FISHER_RULE = Param(
    "fisher_rule", str, "sampled", "Whose answers the log-likelihood's gradient is taken of: sampled (one answer "
    "sampled from the agent per example: Matena & Raffel's Fisher), greedy (the agent's greedy answer) or reference "
    "(the task's reference answer: the empirical Fisher many implementations use).", choices=FISHER_RULES,
    label="Fisher answers")
FISHER_FLOOR = Param(
    "fisher_floor", float, 1e-6, "Added to every agent's Fisher before weighting (MergeLM/FusionBench: 1e-6): where "
    "every Fisher is 0 the element takes the mean of the task vectors.", low=0.0, float32=True, step=1e-6,
    label="floor (added to F)")


def fisher_merge(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    """λ·Σ_t F'_t τ_t / Σ_t F'_t element-wise, F'_t = F_t + floor; the mean where Σ_t F'_t = 0."""
    fisher = ctx.side
    if fisher is None or fisher.shape != taus.shape:
        raise RamStudioError(f"fisher needs each agent's Fisher for tensor {ctx.tensor!r}.",
                             "Merge through the CLI, the app or the Python API: they compute it.")
    if not bool(torch.isfinite(fisher).all()) or bool((fisher < 0).any()):
        raise RamStudioError(f"a Fisher file holds a negative, NaN or infinite value in tensor {ctx.tensor!r}.",
                             "Compute the Fisher again (a Fisher is a mean of squares: finite and ≥ 0).")
    floor, lam = f32(ctx.params["fisher_floor"]), f32(ctx.params["lambda"])
    num = torch.zeros_like(taus[0])
    den = torch.zeros_like(taus[0])
    total = torch.zeros_like(taus[0])
    for t in range(taus.shape[0]):  # agent by agent, in order: the same bits whatever the chunking
        w = fisher[t] + floor
        num += w * taus[t]
        den += w
        total += taus[t]
    weighted = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), total * f32(1.0 / taus.shape[0]))
    return weighted * lam


register(MergeMethod(
    "fisher", "Fisher merging: θ0 + λ·Σ_t F_t τ_t / Σ_t F_t, F_t each agent's diagonal Fisher on its own task.",
    fisher_merge, (LAMBDA, FISHER_EXAMPLES, FISHER_RULE, FISHER_FLOOR), side_tensors="fisher"))

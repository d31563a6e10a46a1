"""Task Arithmetic (τ_m = λ·Σ_t τ_t) and plain averaging (λ = 1/N): the methods that dilute unique updates."""
from __future__ import annotations

import numpy as np
import torch

from merging.methods.base import ChunkContext, MergeMethod
from merging.methods.mergekit_map import GTA_DEFAULTS, Mergekit, MergekitEquivalent, MergekitInput, MergekitRead, refuse
from merging.methods.params import LAMBDA
from merging.methods.regions import f32
from merging.methods.registry import register


def task_arithmetic(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    """λ·Σ_t τ_t (Ilharco et al.), λ as float32."""
    return taus.sum(0) * f32(ctx.params["lambda"])


def average(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    """Element-wise mean of the task vectors, i.e. the mean of the agents' weights (TA with λ = 1/N)."""
    return taus.sum(0) * f32(1.0 / taus.shape[0])


def _fused_ta(base, agents, ctx: ChunkContext, out, peak) -> None:
    from merging.kernels.linear import linear

    linear(base, agents, np.float32(ctx.params["lambda"]), out, peak)


def _fused_average(base, agents, ctx: ChunkContext, out, peak) -> None:
    from merging.kernels.linear import linear

    linear(base, agents, np.float32(1.0 / len(agents)), out, peak)


def _ta_from_mergekit(c: MergekitInput) -> dict[str, float]:
    """mergekit 0.1.5's task_arithmetic: θ0 + λ·Σ w_t τ_t, divided by Σ w_t when `normalize` (default false)."""
    w, lam = c.weight(), c.parameters["lambda"]
    return {"lambda": lam / c.n if c.parameters["normalize"] else lam * w}


def _average_from_mergekit(c: MergekitInput) -> dict[str, float]:
    """mergekit 0.1.5's linear: Σ w_t θ_t / Σ w_t (`normalize` default true) over the listed models, the base
    only if listed."""
    c.weight()
    if c.base_listed:
        raise refuse("linear lists base_model among the models",
                     "RAM Studio's average is the mean of the agents; list only the agents.")
    if not c.parameters["normalize"]:
        raise refuse("linear with normalize: false sums the models' weights",
                     "Only normalize: true (the weighted mean) is an average.")
    return {}


TA_MERGEKIT = Mergekit(lambda p, n: MergekitEquivalent("task_arithmetic", {"lambda": p["lambda"]}, {"weight": 1.0}),
                       (MergekitRead("task_arithmetic", dict(GTA_DEFAULTS), frozenset({"weight"}), _ta_from_mergekit),))
AVERAGE_MERGEKIT = Mergekit(lambda p, n: MergekitEquivalent("task_arithmetic", {"lambda": 1.0 / n}, {"weight": 1.0}),
                            (MergekitRead("linear", {"normalize": True}, frozenset({"weight"}),
                                          _average_from_mergekit),))

register(MergeMethod("task_arithmetic", "Task Arithmetic: θ0 + λ·Σ_t τ_t.", task_arithmetic, (LAMBDA,),
                     fused=_fused_ta, kernels=("linear",), mergekit=TA_MERGEKIT))
register(MergeMethod("average", "Averaging: θ0 + (1/N)·Σ_t τ_t (the mean of the agents).", average,
                     fused=_fused_average, kernels=("linear",), mergekit=AVERAGE_MERGEKIT))

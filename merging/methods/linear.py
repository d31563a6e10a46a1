"""Task Arithmetic (τ_m = λ·Σ_t τ_t) and plain averaging (λ = 1/N): the methods that dilute unique updates."""
from __future__ import annotations

import numpy as np
import torch

from merging.methods.regions import f32
from merging.methods.base import ChunkContext, MergeMethod
from merging.methods.params import LAMBDA
from merging.methods.registry import register


def task_arithmetic(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    """λ·Σ_t τ_t (Ilharco et al.), λ as float32."""
    return taus.sum(0) * f32(ctx.params["lambda"])


def average(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    """Element-wise mean of the task vectors, i.e. the mean of the agents' weights (TA with λ = 1/N)."""
    return taus.sum(0) * f32(1.0 / taus.shape[0])


def _fused_ta(base, agents, ctx: ChunkContext, out, peak) -> None:
    from merging.kernels import cpu

    cpu.linear(base, agents, np.float32(ctx.params["lambda"]), out, peak)


def _fused_average(base, agents, ctx: ChunkContext, out, peak) -> None:
    from merging.kernels import cpu

    cpu.linear(base, agents, np.float32(1.0 / len(agents)), out, peak)


register(MergeMethod("task_arithmetic", "Task Arithmetic: θ0 + λ·Σ_t τ_t.", task_arithmetic, (LAMBDA,),
                     fused=_fused_ta))
register(MergeMethod("average", "Averaging: θ0 + (1/N)·Σ_t τ_t (the mean of the agents).", average,
                     fused=_fused_average))

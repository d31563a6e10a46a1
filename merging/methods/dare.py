"""DARE (drop and rescale) combined with Task Arithmetic or TIES.

Choices (docs/methods.md, "Where our maths differs"): each element is kept with probability 1−p and kept
entries are scaled by 1/(1−p) (DARE paper, MergeLM, peft; mergekit instead rescales to preserve the L1 norm).
The keep mask comes from a counter-based hash of (seed, agent, tensor name, flat element index), so it is
the same whatever the tensor order, the chunk size or the device. The agent is keyed by its position in
the agent list (`methods.base.agent_seed_keys`), never by how its path was written: the same inputs in the
same order with the same parameters give the same model from any folder or machine. (A key from the
agent's contents would need its whole fingerprint before the first chunk is merged, which a streaming
merge does not have; reordering the agents therefore draws other masks.) DARE+TIES then elects signs and takes
the disjoint mean of the rescaled vectors (no further top-k trim).
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from merging.methods.base import ChunkContext, MergeMethod
from merging.methods.mergekit_map import GTA_DEFAULTS, Mergekit, MergekitEquivalent, MergekitInput, MergekitRead, refuse
from merging.methods.params import LAMBDA, Param
from merging.methods.regions import f32
from merging.methods.registry import register
from merging.methods.ties import elect_and_mean

_M1 = -4658895280553007687  # 0xbf58476d1ce4e5b9 as signed int64 (splitmix64 constants)
_M2 = -7723592293110705685  # 0x94d049bb133111eb
_LOW34, _LOW37, _LOW33 = (1 << 34) - 1, (1 << 37) - 1, (1 << 33) - 1


def stream_key(seed: int, agent_key: str, tensor: str) -> int:
    """A 63-bit key for one (seed, agent, tensor) stream, independent of processing order."""
    digest = hashlib.sha256(f"{seed}\x00{agent_key}\x00{tensor}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def uniform(key: int, offset: int, count: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Uniform [0, 1) floats for flat indices offset..offset+count−1 of one stream (splitmix64 finaliser)."""
    x = torch.arange(offset, offset + count, dtype=torch.int64, device=device) + key
    # Logical right shifts on int64: shift, then clear the bits an arithmetic shift copied from the sign.
    x = (x ^ ((x >> 30) & _LOW34)) * _M1
    x = (x ^ ((x >> 27) & _LOW37)) * _M2
    x = x ^ ((x >> 31) & _LOW33)
    return ((x >> 40) & 0xFFFFFF).to(torch.float32) * (1.0 / (1 << 24))


def keep_mask(ctx: ChunkContext, agent: int, count: int, device: torch.device) -> torch.Tensor:
    key = stream_key(ctx.params["seed"], ctx.agent_keys[agent], ctx.tensor)
    return uniform(key, ctx.offset, count, device) >= f32(ctx.params["drop_rate"])


def drop_and_rescale(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    """Zero each element with probability p and scale survivors by 1/(1−p)."""
    p = ctx.params["drop_rate"]
    if p == 0:
        return taus
    flat = taus.reshape(taus.shape[0], -1)
    masks = torch.stack([keep_mask(ctx, t, flat.shape[1], taus.device) for t in range(taus.shape[0])])
    return (flat * masks * f32(1.0 / (1.0 - p))).view_as(taus)


def dare_ta(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    return drop_and_rescale(taus, ctx).sum(0) * f32(ctx.params["lambda"])


def dare_ties(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    return elect_and_mean(drop_and_rescale(taus, ctx)) * f32(ctx.params["lambda"])


def _fused(ties_mode: bool):
    def run(base, agents, ctx: ChunkContext, out, peak) -> None:
        from merging.kernels.dare import dare

        p = ctx.params["drop_rate"]
        keys = np.array([stream_key(ctx.params["seed"], k, ctx.tensor) for k in ctx.agent_keys], np.uint64)
        dare(base, agents, keys, ctx.offset, np.float32(p), np.float32(1.0 / (1.0 - p)),
                 np.float32(ctx.params["lambda"]), ties_mode, out, peak)

    return run


DROP = Param("drop_rate", float, 0.5, "Drop rate p of DARE, in [0, 1) (paper's grid: 0.1 … 0.9).",
             low=0.0, high=1.0, high_open=True, step=0.05, label="p (drop rate)")
SEED = Param("seed", int, 0, "Seed of the DARE keep masks (per seed, agent and tensor).", low=0)


def _factors(p: dict) -> dict[str, float]:
    """p is compared as a float32 (keep iff u ≥ p): p rounding to 1 would drop everything."""
    keep = 1.0 - float(np.float32(p["drop_rate"]))
    return {"the rescale 1/(1−p)": 1.0 / keep if keep > 0 else float("inf")}



def _from_mergekit(ties_mode: bool):
    """mergekit 0.1.5's dare_linear / dare_ties: random drop keeping a `density` share, `rescale` (default
    true) to keep the L1 norm, then as task_arithmetic / ties (`normalize` default false for both)."""

    def translate(c: MergekitInput) -> dict[str, float]:
        w, g = c.weight(), c.parameters
        density = c.density()
        if not g["rescale"]:
            raise refuse(f"{c.method} with rescale: false",
                         "RAM Studio's DARE always rescales kept entries by 1/(1−p).")
        if not 0 < density <= 1:
            raise refuse(f"density {density} must be in (0, 1]")
        c.notes.append("DARE keeps each element with probability density and rescales by 1/density (mergekit rescales "
                       "to the L1 norm); its masks come from a seeded hash, so the drops differ from mergekit's "
                       "random ones")
        if not ties_mode:
            return {"drop_rate": 1.0 - density, "lambda": g["lambda"] / c.n if g["normalize"] else g["lambda"] * w}
        if not g["normalize"]:
            raise refuse("dare_ties with normalize: false sums the agreeing task vectors",
                         "RAM Studio's dare_ties takes their mean: set normalize: true.")
        return {"drop_rate": 1.0 - density, "lambda": g["lambda"]}

    return translate


def _mergekit(ties_mode: bool) -> Mergekit:
    name = "dare_ties" if ties_mode else "dare_linear"

    def write(p: dict, n_agents: int) -> MergekitEquivalent:
        return MergekitEquivalent(name, {"lambda": p["lambda"], **({"normalize": True} if ties_mode else {}),
                                         "rescale": True}, {"weight": 1.0, "density": 1.0 - p["drop_rate"]}, (
            "DARE drops are random: mergekit draws its own masks (RAM Studio's come from a seeded hash) and "
            "rescales to the L1 norm instead of by 1/(1−p), so the same config gives a different draw"))

    read = MergekitRead(name, {**GTA_DEFAULTS, "rescale": True}, frozenset({"weight", "density"}),
                        _from_mergekit(ties_mode))
    return Mergekit(write, (read,))


register(MergeMethod("dare_ta", "DARE + Task Arithmetic: drop with rate p, rescale by 1/(1−p), then λ·Σ.",
                     dare_ta, (DROP, LAMBDA, SEED), factors=_factors, fused=_fused(False), kernels=("dare",),
                     mergekit=_mergekit(False)))
register(MergeMethod("dare_ties", "DARE + TIES: drop and rescale, elect sign, disjoint mean, scale by λ.",
                     dare_ties, (DROP, LAMBDA, SEED), factors=_factors, fused=_fused(True), kernels=("dare",),
                     mergekit=_mergekit(True)))

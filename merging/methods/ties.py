"""TIES-Merging: trim each τ_t to its top-k magnitudes per tensor, elect a sign, take the disjoint mean.

Choices (docs/methods.md, "Where our maths differs"): k = int(density·n) per tensor, exactly k kept; ties at the
threshold are broken by flat index (lowest first), so the result does not depend on chunking. The
threshold is found exactly by a two-pass radix select on the float32 bit pattern of |τ| (16 high,
then 16 low bits), so no full sort and memory bounded by the chunk size. A zero sign sum elects +
(mergekit, peft). θ = θ0 + λ·τ_m.
"""
from __future__ import annotations

import numpy as np
import torch

from merging.methods.base import ChunkContext, MergeMethod, TensorPass
from merging.methods.mergekit_map import GTA_DEFAULTS, Mergekit, MergekitEquivalent, MergekitInput, MergekitRead, refuse
from merging.methods.params import LAMBDA, Param
from merging.methods.regions import f32
from merging.methods.registry import register

_HI = 1 << 15  # |τ| has its sign bit clear, so the high 16 bits of its float32 pattern are < 2^15
_LO = 1 << 16


def _bits(taus: torch.Tensor) -> torch.Tensor:
    """float32 |τ| reinterpreted as int32: the order of non-negative floats equals the order of their bits."""
    return taus.abs().contiguous().view(torch.int32)


def _per_agent_bincount(keys: torch.Tensor, bins: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Histogram of `keys` (N, E) per agent in one bincount, optionally only where `valid`."""
    n = keys.shape[0]
    offsets = (torch.arange(n, device=keys.device, dtype=torch.int64) * bins).view(-1, 1)
    flat = (keys.to(torch.int64) + offsets)
    if valid is not None:
        flat = flat[valid]
    return torch.bincount(flat.reshape(-1), minlength=n * bins).view(n, bins).cpu()


def _coarse_reduce(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    return _per_agent_bincount(_bits(taus) >> 16, _HI)


def _select_bin(hist: torch.Tensor, rank: int) -> tuple[int, int]:
    """Bin holding the rank-th largest element (rank ≥ 1) and that element's rank inside the bin."""
    above = np.cumsum(hist.numpy()[::-1])  # counts of elements in bins ≥ each bin, from the top
    pos = int(np.searchsorted(above, rank))  # first bin (from the top) reaching the rank
    b = len(above) - 1 - pos
    before = int(above[pos - 1]) if pos > 0 else 0
    return b, rank - before


def _coarse_finish(total: torch.Tensor, ctx: ChunkContext) -> None:
    k = int(ctx.params["density"] * ctx.numel)
    sel = []
    for t in range(total.shape[0]):
        sel.append(_select_bin(total[t], k) if 0 < k < ctx.numel else (None, 0))
    ctx.state["k"] = k
    ctx.state["hi"] = sel


def _fine_reduce(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    bits = _bits(taus)
    his = torch.tensor([h if h is not None else -1 for h, _ in ctx.state["hi"]], device=bits.device).view(-1, 1)
    return _per_agent_bincount(bits & 0xFFFF, _LO, (bits >> 16) == his)


def _fine_finish(total: torch.Tensor, ctx: ChunkContext) -> None:
    thresholds, keep_equal = [], []
    for t, (hi, rank) in enumerate(ctx.state["hi"]):
        if hi is None:
            thresholds.append(None)
            keep_equal.append(0)
            continue
        lo, rank_in = _select_bin(total[t], rank)
        thresholds.append((hi << 16) | lo)
        keep_equal.append(rank_in)  # how many elements equal to the threshold are kept
    ctx.state["threshold"] = thresholds
    ctx.state["keep_equal"] = keep_equal
    ctx.state["seen_equal"] = np.zeros(len(thresholds), np.int64)  # shared by the torch and kernel paths


def trim_mask(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    """Top-k mask per agent for this chunk, using the thresholds found by the passes (chunks in order)."""
    k = ctx.state["k"]
    if k >= ctx.numel:
        return torch.ones_like(taus, dtype=torch.bool)
    if k <= 0:
        return torch.zeros_like(taus, dtype=torch.bool)
    bits = _bits(taus)
    rows = []
    for t, thr in enumerate(ctx.state["threshold"]):
        equal = bits[t] == thr
        rank = equal.to(torch.int64).cumsum(0) + int(ctx.state["seen_equal"][t])  # 1-based rank among equals
        rows.append((bits[t] > thr) | (equal & (rank <= ctx.state["keep_equal"][t])))
        ctx.state["seen_equal"][t] += int(equal.sum())
    return torch.stack(rows)


def elect_and_mean(taus: torch.Tensor) -> torch.Tensor:
    """Sign election (zero sum elects +) and the disjoint mean over agents agreeing with it (0 if none)."""
    elected = torch.where(taus.sum(0) >= 0, 1.0, -1.0).to(taus.dtype)
    agree = (torch.sign(taus) == elected) & (taus != 0)
    count = agree.sum(0)
    total = (taus * agree).sum(0)
    return torch.where(count > 0, total / count.clamp(min=1).to(taus.dtype), torch.zeros_like(total))


def ties(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    """θ0 + λ·disjoint_mean(elect(trim(τ)))."""
    trimmed = taus * trim_mask(taus, ctx)
    return elect_and_mean(trimmed) * f32(ctx.params["lambda"])


def _fused_coarse(base, agents, ctx: ChunkContext) -> torch.Tensor:
    from merging.kernels.common import hist_parts
    from merging.kernels.ties import abs_bits_histogram

    dummy = np.zeros(len(agents), np.int32)
    return torch.from_numpy(abs_bits_histogram(base, agents, False, dummy, hist_parts(base.size)).sum(0))


def _fused_fine(base, agents, ctx: ChunkContext) -> torch.Tensor:
    from merging.kernels.common import hist_parts
    from merging.kernels.ties import abs_bits_histogram

    his = np.array([h if h is not None else -1 for h, _ in ctx.state["hi"]], np.int32)
    parts = abs_bits_histogram(base, agents, True, his, hist_parts(base.size))
    # Kept per chunk and partition: once the threshold is known, they say how many threshold-equal
    # elements come before each partition, so the merge can run partitions in parallel.
    ctx.state.setdefault("fine_parts", {})[ctx.offset] = parts
    return torch.from_numpy(parts.sum(0))


def _fused(base, agents, ctx: ChunkContext, out, peak) -> None:
    """TIES through the kernel; 'keep all' / 'keep none' become thresholds no bit pattern can cross."""
    from merging.kernels.common import hist_parts
    from merging.kernels.ties import ties_merge

    n, k = len(agents), ctx.state["k"]
    parts = ctx.state.get("fine_parts", {}).pop(ctx.offset, None)
    nparts = hist_parts(base.size)
    if k >= ctx.numel or k <= 0 or parts is None:
        thr = np.full(n, -1 if k > 0 else np.iinfo(np.int32).max, np.int32)
        keep_equal = np.zeros(n, np.int64)
        equal = np.zeros((nparts, n), np.int64)
    else:
        thr = np.array(ctx.state["threshold"], np.int32)
        keep_equal = np.array(ctx.state["keep_equal"], np.int64)
        lows = thr & 0xFFFF
        equal = parts[:, np.arange(n), lows]  # (nparts, N): threshold-equal elements per partition
    first = np.zeros_like(equal)
    first[1:] = np.cumsum(equal, axis=0)[:-1]
    first += ctx.state["seen_equal"][None, :]
    own_peak = np.zeros((nparts, n), np.float32)
    ties_merge(base, agents, thr, keep_equal, first, np.float32(ctx.params["lambda"]), out, own_peak)
    ctx.state["seen_equal"] += equal.sum(axis=0)
    peak[:] = 0
    peak[0] = own_peak.max(axis=0)


def _passes(p: dict) -> tuple[TensorPass, ...]:
    return (TensorPass("topk_coarse", _coarse_reduce, _coarse_finish, _fused_coarse),
            TensorPass("topk_fine", _fine_reduce, _fine_finish, _fused_fine))


DENSITY = Param("density", float, 0.2, "Fraction of each task vector kept per tensor (paper's grid: 0.1-0.3).",
                low=0.0, high=1.0, low_open=True, step=0.05, label="density (kept share)")



def _from_mergekit(c: MergekitInput) -> dict[str, float]:
    """mergekit 0.1.5's ties: top-k trim per tensor (k from `density`), sign election on Σ w_t τ_t, then Σ of
    the agreeing w_t τ_t divided by the agreeing Σ w_t when `normalize` (default true) — with equal weights,
    the disjoint mean — then × λ."""
    c.weight()
    lam = c.parameters["lambda"]
    density = c.density()
    if not c.parameters["normalize"]:
        raise refuse("ties with normalize: false sums the agreeing task vectors",
                     "RAM Studio's TIES takes their mean (normalize: true, mergekit's default).")
    c.notes.append("TIES keeps exactly int(density·n) elements per tensor, ties at the threshold broken by index "
                   "(mergekit: max(1, int(density·n)), unstable order)")
    return {"density": density, "lambda": lam}


def _to_mergekit(p: dict, n_agents: int) -> MergekitEquivalent:
    return MergekitEquivalent("ties", {"lambda": p["lambda"], "normalize": True},
                              {"weight": 1.0, "density": p["density"]},
                              "mergekit keeps max(1, int(density·n)) elements per tensor and breaks ties at the "
                              "threshold differently")


MERGEKIT = Mergekit(_to_mergekit, (MergekitRead("ties", {**GTA_DEFAULTS, "normalize": True},
                                                frozenset({"weight", "density"}), _from_mergekit),))

register(MergeMethod("ties", "TIES: trim to top-k per tensor, elect sign, disjoint mean, scale by λ.",
                     ties, (DENSITY, LAMBDA), _passes, fused=_fused, kernels=("abs_bits_histogram", "ties_merge"),
                     mergekit=MERGEKIT))

"""Merging one tensor from a stream of chunks: run the method's passes, then its merge, chunk by chunk.

The streaming engine and the in-memory helper (tests, the app's toy examples) share this, so the same
code decides results whatever the chunk size.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from .methods import get_method
from .methods.base import ChunkContext, MergeMethod
from .methods.ram import overlap_masks


class ChunkInputs:
    """One chunk as float32: base (E,) and agents (N, E); τ = agents − base is made only when needed.

    With `keep_agents` False (the torch/GPU path) τ is computed in place, saving one (N, E) buffer;
    the fused CPU kernels read base and agents directly and compute τ themselves.
    """

    def __init__(self, base: torch.Tensor, agents: torch.Tensor, keep_agents: bool) -> None:
        self.base = base
        self.agents = agents
        self._keep = keep_agents
        self._taus: torch.Tensor | None = None

    @property
    def taus(self) -> torch.Tensor:
        if self._taus is None:
            self._taus = self.agents - self.base if self._keep else self.agents.sub_(self.base)
        return self._taus

    def numpy(self) -> tuple[Any, Any]:
        return self.base.numpy(), self.agents.numpy()


class TensorMerger:
    """State machine for one tensor: `reduce` chunks for each pass round, then `merge` chunks in order.

    With `fused` set (CPU, numba available) passes and merges use the method's fused kernels where it
    has them, and the torch functions otherwise; both give the same bits.
    """

    def __init__(self, method: MergeMethod, params: dict[str, Any], tensor: str, numel: int,
                 agent_keys: tuple[str, ...], shared: dict[str, Any], fused: bool = False) -> None:
        self.method = method
        self.passes = method.passes(params)
        self.ctx = ChunkContext(tensor, 0, numel, agent_keys, params, {}, shared)
        self.fused = fused
        self._total: torch.Tensor | None = None

    @property
    def rounds(self) -> int:
        """Number of times the tensor's chunks are visited: one per pass, plus the merge."""
        return len(self.passes) + 1

    def reduce(self, round_: int, offset: int, chunk: ChunkInputs) -> None:
        self.ctx.offset = offset
        p = self.passes[round_]
        if self.fused and p.fused_reduce is not None:
            part = p.fused_reduce(*chunk.numpy(), self.ctx)
        else:
            part = p.reduce(chunk.taus, self.ctx)
        self._total = part if self._total is None else self._total + part

    def finish_round(self, round_: int) -> None:
        self.passes[round_].finish(self._total, self.ctx)
        self._total = None

    def merge(self, offset: int, chunk: ChunkInputs) -> torch.Tensor:
        """θ0 + τ_m for the chunk, float32 (E,)."""
        self.ctx.offset = offset
        if self.fused and self.method.fused is not None:
            out = torch.empty_like(chunk.base)
            self.method.fused(*chunk.numpy(), self.ctx, out.numpy())
            return out
        return chunk.base + self.method.merge(chunk.taus, self.ctx)


def whole_counts(taus: torch.Tensor, eps: float) -> dict[str, list[int]]:
    """Shared/unique counts per agent over all of `taus` (N, ...), i.e. global ρ for an in-memory model."""
    m, c = overlap_masks(taus.reshape(taus.shape[0], -1), eps)
    return {"shared": (m & (c >= 2)).sum(1).tolist(), "unique": (m & (c == 1)).sum(1).tolist()}


def merge_in_memory(method: str | MergeMethod, taus: torch.Tensor, params: dict[str, Any] | None = None, *,
                    chunk_elems: int | None = None, agents: Iterable[str] | None = None,
                    tensor: str = "tensor", counts: dict[str, list[int]] | None = None,
                    base: torch.Tensor | None = None, fused: bool = False) -> torch.Tensor:
    """Merge task vectors `taus` (N, ...) of one tensor in float32 and return τ_m; for tests and toys.

    With `base` given the result is θ0 + τ_m instead, and `fused` runs the CPU kernels (tests compare).
    """
    m = get_method(method) if isinstance(method, str) else method
    p = m.resolve_params(params or {})
    labels = list(agents) if agents is not None else [f"agent{i}" for i in range(taus.shape[0])]
    flat = taus.to(torch.float32).reshape(taus.shape[0], -1)
    eps = m.global_counts_eps(p)
    if eps is not None and counts is None:
        counts = whole_counts(flat, eps)
    shared = m.prepare(p, counts if eps is not None else None, labels)
    tm = TensorMerger(m, p, tensor, flat.shape[1], tuple(labels), shared, fused=fused)
    zero = base is None
    b = torch.zeros(flat.shape[1]) if zero else base.to(torch.float32).reshape(-1)
    agents_f = flat + b  # θ_t = θ0 + τ_t, so that the chunk inputs look like real models

    def chunk(lo: int, hi: int) -> ChunkInputs:
        c = ChunkInputs(b[lo:hi].contiguous(), agents_f[:, lo:hi].contiguous(), keep_agents=True)
        if zero:
            c._taus = flat[:, lo:hi]  # exact τ (adding and removing a zero base is exact anyway)
        return c

    step = chunk_elems or max(1, flat.shape[1])
    spans = [(o, min(o + step, flat.shape[1])) for o in range(0, max(1, flat.shape[1]), step)]
    for r in range(len(tm.passes)):
        for lo, hi in spans:
            tm.reduce(r, lo, chunk(lo, hi))
        tm.finish_round(r)
    out = torch.cat([tm.merge(lo, chunk(lo, hi)) for lo, hi in spans])
    return out.view(taus.shape[1:])

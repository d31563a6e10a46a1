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


class TensorMerger:
    """State machine for one tensor: `reduce` chunks for each pass round, then `merge` chunks in order."""

    def __init__(self, method: MergeMethod, params: dict[str, Any], tensor: str, numel: int,
                 agent_keys: tuple[str, ...], shared: dict[str, Any]) -> None:
        self.method = method
        self.passes = method.passes(params)
        self.ctx = ChunkContext(tensor, 0, numel, agent_keys, params, {}, shared)
        self._total: torch.Tensor | None = None

    @property
    def rounds(self) -> int:
        """Number of times the tensor's chunks are visited: one per pass, plus the merge."""
        return len(self.passes) + 1

    def reduce(self, round_: int, offset: int, taus: torch.Tensor) -> None:
        self.ctx.offset = offset
        part = self.passes[round_].reduce(taus, self.ctx)
        self._total = part if self._total is None else self._total + part

    def finish_round(self, round_: int) -> None:
        self.passes[round_].finish(self._total, self.ctx)
        self._total = None

    def merge(self, offset: int, taus: torch.Tensor) -> torch.Tensor:
        self.ctx.offset = offset
        return self.method.merge(taus, self.ctx)


def whole_counts(taus: torch.Tensor, eps: float) -> dict[str, list[int]]:
    """Shared/unique counts per agent over all of `taus` (N, ...), i.e. global ρ for an in-memory model."""
    m, c = overlap_masks(taus.reshape(taus.shape[0], -1), eps)
    return {"shared": (m & (c >= 2)).sum(1).tolist(), "unique": (m & (c == 1)).sum(1).tolist()}


def merge_in_memory(method: str | MergeMethod, taus: torch.Tensor, params: dict[str, Any] | None = None, *,
                    chunk_elems: int | None = None, agents: Iterable[str] | None = None,
                    tensor: str = "tensor", counts: dict[str, list[int]] | None = None) -> torch.Tensor:
    """Merge task vectors `taus` (N, ...) of one tensor in float32 and return τ_m; for tests and toys."""
    m = get_method(method) if isinstance(method, str) else method
    p = m.resolve_params(params or {})
    labels = list(agents) if agents is not None else [f"agent{i}" for i in range(taus.shape[0])]
    flat = taus.to(torch.float32).reshape(taus.shape[0], -1)
    eps = m.global_counts_eps(p)
    if eps is not None and counts is None:
        counts = whole_counts(flat, eps)
    shared = m.prepare(p, counts if eps is not None else None, labels)
    tm = TensorMerger(m, p, tensor, flat.shape[1], tuple(labels), shared)
    step = chunk_elems or max(1, flat.shape[1])
    spans = [(o, min(o + step, flat.shape[1])) for o in range(0, max(1, flat.shape[1]), step)]
    for r in range(len(tm.passes)):
        for a, b in spans:
            tm.reduce(r, a, flat[:, a:b])
        tm.finish_round(r)
    out = torch.cat([tm.merge(a, flat[:, a:b]) for a, b in spans]) if spans else flat.sum(0)
    return out.view(taus.shape[1:])

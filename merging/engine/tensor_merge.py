"""Merging one tensor from a stream of chunks: run the method's passes, then its merge, chunk by chunk.

The streaming engine and the in-memory helper (`merge_in_memory`, for tests) share this, so the same code
decides results whatever the chunk size. (The Signal dilution page's toy merges with `merging/methods/whole.py`,
the same functions without streaming.)
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import torch

from merging.common.dtypes import ST_TO_TORCH
from merging.kernels import one_thread_for
from merging.methods import get_method, regions
from merging.methods.base import ChunkContext, MergeMethod, agent_seed_keys
from merging.reading.chunk_inputs import ChunkInputs, max_over_parts

_CODES = {v: k for k, v in ST_TO_TORCH.items()}


class TensorMerger:
    """State machine for one tensor: `reduce` chunks for each pass round, then `merge` chunks in order.

    With `fused` set (CPU, numba available) passes and merges use the method's fused kernels where it
    has them, and the torch functions otherwise; both give the same bits.
    """

    def __init__(self, method: MergeMethod, params: dict[str, Any], tensor: str, numel: int,
                 n_agents: int, shared: dict[str, Any], fused: bool = False, dtype: str = "F32") -> None:
        self.method = method
        self.passes = method.passes(params)
        self.ctx = ChunkContext(tensor, 0, numel, agent_seed_keys(n_agents), params, {}, shared, dtype)
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
            from merging.kernels.common import parts

            with one_thread_for(parts(chunk.numel)):
                part = p.fused_reduce(*chunk.raw(), self.ctx)
        else:
            self.ctx.base = chunk.base
            part = p.reduce(chunk.taus, self.ctx)
        self._total = part if self._total is None else self._total + part

    def finish_round(self, round_: int) -> None:
        self.passes[round_].finish(self._total, self.ctx)
        self._total = None

    def merge(self, offset: int, chunk: ChunkInputs, out: torch.Tensor | None = None,
              side: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """θ0 + τ_m for the chunk (float32, (E,)) and each agent's max |τ| in it (NaN if any τ is NaN).

        The fused kernels write into `out` (float32, (E,)) when it is given; `side` is the chunk's per-agent
        side tensors ((N, E) float32 on the compute device) for a method that reads them."""
        self.ctx.offset = offset
        self.ctx.side = side
        if self.fused and self.method.fused is not None:
            from merging.kernels.common import parts

            base, agents = chunk.raw()
            out = np.empty(chunk.numel, np.float32) if out is None else out.numpy()
            peak = np.zeros((parts(chunk.numel), len(agents)), np.float32)
            with one_thread_for(peak.shape[0]):
                self.method.fused(base, agents, self.ctx, out, peak)
            return torch.from_numpy(out), max_over_parts(peak)
        peak = chunk.peak_abs_tau(fused=False)  # before merge, which may work on τ in place
        self.ctx.base = chunk.base
        return chunk.base + self.method.merge(chunk.taus, self.ctx), peak


def merge_in_memory(method: str | MergeMethod, taus: torch.Tensor, params: dict[str, Any] | None = None, *,
                    chunk_elems: int | None = None, agents: Iterable[str] | None = None,
                    tensor: str = "tensor", counts: dict[str, list[int]] | None = None,
                    base: torch.Tensor | None = None, fused: bool = False, dtype: str | None = None,
                    side: torch.Tensor | None = None) -> torch.Tensor:
    """Merge task vectors `taus` (N, ...) of one tensor in float32 and return τ_m; for tests and toys.

    With `base` given the result is θ0 + τ_m instead, and `fused` runs the CPU kernels (tests compare).
    `dtype` is the stored dtype a rule in steps counts in (default: the base's torch dtype, else float32); `side`
    (N, ...) are the agents' side tensors (e.g. their diagonal Fisher) for a method that reads them.
    """
    m = get_method(method) if isinstance(method, str) else method
    p = m.resolve_params(params or {})
    labels = list(agents) if agents is not None else [f"agent{i}" for i in range(taus.shape[0])]
    flat = taus.to(torch.float32).reshape(taus.shape[0], -1)
    code = dtype or (_CODES.get(base.dtype, "F32") if base is not None else "F32")
    zero = base is None
    b = torch.zeros(flat.shape[1]) if zero else base.to(torch.float32).reshape(-1)
    eps = m.global_counts_eps(p)
    if eps is not None and counts is None:
        counts = regions.count_lists(regions.counts(flat, eps, b, code))
    shared = m.prepare(p, counts if eps is not None else None, labels)
    tm = TensorMerger(m, p, tensor, flat.shape[1], len(labels), shared, fused=fused, dtype=code)
    agents_f = flat + b  # θ_t = θ0 + τ_t, so that the chunk inputs look like real models

    def chunk(lo: int, hi: int) -> ChunkInputs:
        c = ChunkInputs(b[lo:hi].contiguous(), list(agents_f[:, lo:hi]), torch.device("cpu"), keep_agents=True)
        if zero:
            c._taus = flat[:, lo:hi]  # exact τ (adding and removing a zero base is exact anyway)
        return c

    step = chunk_elems or max(1, flat.shape[1])
    spans = [(o, min(o + step, flat.shape[1])) for o in range(0, max(1, flat.shape[1]), step)]
    for r in range(len(tm.passes)):
        for lo, hi in spans:
            tm.reduce(r, lo, chunk(lo, hi))
        tm.finish_round(r)
    side_f = None if side is None else side.to(torch.float32).reshape(side.shape[0], -1)
    out = torch.cat([tm.merge(lo, chunk(lo, hi), side=None if side_f is None else side_f[:, lo:hi])[0]
                     for lo, hi in spans])
    return out.view(taus.shape[1:])

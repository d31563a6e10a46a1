"""One tensor's task vectors merged whole, in memory, on the torch path: a method's passes, its merge-wide
`prepare` and its merge function, exactly as the engine runs them on a single chunk — without the engine's
streaming, devices or kernels. For small in-memory examples (the Signal dilution page's toy); the engine's
`merge_in_memory` gives the same values (tests compare) and adds chunking and the fused path."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from merging.methods import regions
from merging.methods.base import ChunkContext, agent_seed_keys
from merging.methods.registry import get_method


def merge_whole(method: str, taus: torch.Tensor, params: dict[str, Any] | None = None,
                agents: Sequence[str] | None = None) -> torch.Tensor:
    """τ_m of task vectors `taus` (N, ...) of one tensor (float32; a zero base), with the method's global ρ
    counted over this tensor where it asks for whole-model counts."""
    m = get_method(method)
    p = m.resolve_params(params or {})
    labels = list(agents) if agents is not None else [f"agent{i}" for i in range(taus.shape[0])]
    flat = taus.to(torch.float32).reshape(taus.shape[0], -1)
    base = torch.zeros(flat.shape[1])
    eps = m.global_counts_eps(p)
    counts = regions.count_lists(regions.counts(flat, eps, base, "F32")) if eps is not None else None
    ctx = ChunkContext("tensor", 0, flat.shape[1], agent_seed_keys(len(labels)), p, {}, m.prepare(p, counts, labels),
                       "F32", base)
    for tensor_pass in m.passes(p):
        tensor_pass.finish(tensor_pass.reduce(flat.clone(), ctx), ctx)
    return m.merge(flat.clone(), ctx).view(taus.shape[1:])

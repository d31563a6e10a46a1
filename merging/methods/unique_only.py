"""Paper Fig. 3 analysis: the base plus one agent's unique region only, optionally diluted by 1/N."""
from __future__ import annotations

from typing import Any

import torch

from merging.common.errors import RamStudioError
from merging.methods import regions
from merging.methods.base import ChunkContext, MergeMethod
from merging.methods.params import EPS, Param
from merging.methods.registry import register


def unique_only(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    """τ_a where agent a is the only active agent (c = 1), else 0; times 1/N when `dilute`."""
    a = ctx.shared["agent_index"]
    m, c = regions.masks(taus, ctx.params["eps"])
    out = torch.where(m[a] & (c == 1), taus[a], torch.zeros_like(taus[a]))
    return out / taus.shape[0] if ctx.params["dilute"] else out


def _prepare(p: dict[str, Any], counts: object, agents: list[str]) -> dict[str, Any]:
    """Find the chosen agent by label or 0-based index."""
    choice = p["agent"]
    if choice in agents:
        return {"agent_index": agents.index(choice)}
    if choice.isdigit() and int(choice) < len(agents):
        return {"agent_index": int(choice)}
    raise RamStudioError(f"unique_only: no agent {choice!r}.", f"Agents: {', '.join(agents)}.")


register(MergeMethod(
    "unique_only", "Base + one agent's unique updates (Fig. 3); with dilute, divided by N like averaging.",
    unique_only,
    (EPS,
     Param("agent", str, None, "Which agent's unique region to keep (its name or 0-based index).", required=True),
     Param("dilute", bool, False, "Divide the unique update by N, simulating averaging's signal dilution.",
           label="dilute (divide by N)")),
    prepare=_prepare,
))

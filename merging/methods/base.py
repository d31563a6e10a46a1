"""What a merge method is: a pure function over float32 task-vector chunks, its parameters and its passes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from merging.common.errors import RamStudioError
from merging.methods.mergekit_map import Mergekit
from merging.methods.params import Param, finite_in_float32


def agent_seed_keys(n_agents: int) -> tuple[str, ...]:
    """The key of each agent's random stream in seeded methods (DARE's keep masks): its position in the
    agent list, so that the same inputs in the same order with the same parameters give the same model,
    however the paths were spelled and wherever the checkout lives. Every merge — the streaming engine,
    `merge_in_memory`, a sweep's in-memory candidates — gets its keys from here (through TensorMerger)."""
    return tuple(f"agent{i}" for i in range(n_agents))


@dataclass
class ChunkContext:
    """What a method may know about the chunk it merges; the engine fills it, methods only read it.

    `taus` handed to a method have shape (N, E): N agents, E elements of the tensor's flat range
    [offset, offset + E). `agent_keys` come from `agent_seed_keys` (the agents' positions). `state` holds
    results of this tensor's passes; `shared` holds merge-wide values (e.g. global λ_t from the overlap
    counts). `dtype` is the base tensor's stored dtype code and `base` the chunk's base weights (float32, (E,),
    on the torch path; the fused kernels get the stored values): what rules in steps of the stored dtype need.
    `side` holds, for a method that declares `side_tensors`, the same range of each agent's side tensor (float32,
    (N, E), e.g. its diagonal Fisher), read chunk by chunk next to the weights; else None.
    """

    tensor: str
    offset: int
    numel: int
    agent_keys: tuple[str, ...]
    params: dict[str, Any]
    state: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    dtype: str = "F32"
    base: torch.Tensor | None = None
    side: torch.Tensor | None = None


@dataclass(frozen=True)
class TensorPass:
    """A reduction over every chunk of one tensor, needed before any chunk of it can be merged.

    `reduce` maps a chunk to a partial result that the engine sums over chunks (in chunk order);
    `finish` turns the total into entries of `ctx.state`.
    """

    name: str
    reduce: Callable[[torch.Tensor, ChunkContext], torch.Tensor]
    finish: Callable[[torch.Tensor, ChunkContext], None]
    # Same result from the stored arrays base (E,) and agents (N arrays) through a fused CPU kernel.
    fused_reduce: Callable[[Any, Any, ChunkContext], torch.Tensor] | None = None


MergeFn = Callable[[torch.Tensor, ChunkContext], torch.Tensor]
# A fused CPU kernel: (base (E,), agents (N arrays), ctx, out (E,), peak (P, N)) → writes θ0 + τ_m into
# out, bit for bit what θ0 + merge(taus, ctx) gives in float32, and each agent's max |τ| into peak.
FusedFn = Callable[[Any, Any, ChunkContext, Any, Any], None]


def _no_passes(params: dict[str, Any]) -> tuple[TensorPass, ...]:
    return ()


def _no_counts(params: dict[str, Any]) -> float | None:
    return None


def _nothing_to_prepare(params: dict[str, Any], counts: dict[str, list[int]] | None,
                        agents: list[str]) -> dict[str, Any]:
    return {}


def _no_factors(params: dict[str, Any]) -> dict[str, float]:
    return {}


@dataclass(frozen=True)
class MergeMethod:
    """A registered method: `merge(taus, ctx)` returns the merged task vector τ_m for the chunk."""

    name: str
    summary: str
    merge: MergeFn
    params: tuple[Param, ...] = ()
    passes: Callable[[dict[str, Any]], tuple[TensorPass, ...]] = _no_passes
    # Returns the ε whose whole-model overlap counts the method needs (global ρ), or None.
    global_counts_eps: Callable[[dict[str, Any]], float | None] = _no_counts
    # Builds merge-wide state from the agents' labels and, when `global_counts_eps` asked for them,
    # whole-model counts {"shared": [...], "unique": [...]} (one entry per agent).
    prepare: Callable[[dict[str, Any], dict[str, list[int]] | None, list[str]], dict[str, Any]] = (
        _nothing_to_prepare)
    # Derived float32 factors the parameters imply (e.g. the largest λ_t): each must stay finite.
    factors: Callable[[dict[str, Any]], dict[str, float]] = _no_factors
    min_agents: int = 2
    fused: FusedFn | None = None
    # The CPU kernels (names in merging.kernels.ALL) that `fused` and the passes' `fused_reduce` call: the
    # engine asks for exactly these and runs them once they are ready; with none, the torch path runs.
    kernels: tuple[str, ...] = ()
    # How the method is written as, and read from, mergekit configs (merging.methods.mergekit_map); None
    # when mergekit has no equivalent.
    mergekit: Mergekit | None = None
    # The kind of per-agent side tensors the method reads (e.g. "fisher": one float32 safetensors file per
    # agent holding a tensor of the base's shape for every float tensor); the merge is given them
    # (merging.reading.side_tensors.SideTensors) and the engine streams them into `ctx.side`. None: no side
    # tensors. Such a method runs on the torch path (no fused kernel) and has no passes.
    side_tensors: str | None = None

    def resolve_params(self, given: dict[str, Any], *, strict: bool = False) -> dict[str, Any]:
        """Fill defaults, coerce types and validate; unknown or invalid values raise a clear error.

        `strict` is for stored values (recipes, YAML configs): types must already be right."""
        known = {p.name: p for p in self.params}
        unknown = sorted(k for k, v in given.items() if v is not None and k not in known)
        if unknown:
            raise RamStudioError(f"method {self.name!r} does not take {', '.join(unknown)}.",
                                 f"Its parameters are: {', '.join(known) or 'none'}.")
        out = {p.name: p.resolve(given.get(p.name), strict=strict) for p in self.params}
        for what, value in self.factors(out).items():
            if not finite_in_float32(value):
                names = ", ".join(f"{p.name}={out[p.name]:g}" for p in self.params if p.float32)
                raise RamStudioError(f"{what} = {value:g} overflows float32 with {names}.",
                                     "Use smaller values: the merge computes in float32.")
        return out

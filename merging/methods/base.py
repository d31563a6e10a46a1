"""What a merge method is: a pure function over float32 task-vector chunks, its parameters and its passes."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ..errors import RamStudioError


@dataclass(frozen=True)
class Param:
    """One method parameter: name, default, type, help, and a check returning an error text or None."""

    name: str
    default: Any
    kind: type
    help: str
    check: Callable[[Any], str | None] | None = None


@dataclass
class ChunkContext:
    """What a method may know about the chunk it merges; the engine fills it, methods only read it.

    `taus` handed to a method have shape (N, E): N agents, E elements of the tensor's flat range
    [offset, offset + E). `state` holds results of this tensor's passes; `shared` holds merge-wide
    values (e.g. global λ_t from the analysis counts).
    """

    tensor: str
    offset: int
    numel: int
    agent_keys: tuple[str, ...]
    params: dict[str, Any]
    state: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)


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


@dataclass(frozen=True)
class MergeMethod:
    """A registered method: `merge(taus, ctx)` returns the merged task vector τ_m for the chunk."""

    name: str
    summary: str
    merge: MergeFn
    params: tuple[Param, ...] = ()
    passes: Callable[[dict[str, Any]], tuple[TensorPass, ...]] = lambda p: ()
    # Returns the ε whose whole-model overlap counts the method needs (global ρ), or None.
    global_counts_eps: Callable[[dict[str, Any]], float | None] = lambda p: None
    # Builds merge-wide state from the agents' labels and, when `global_counts_eps` asked for them,
    # whole-model counts {"shared": [...], "unique": [...]} (one entry per agent).
    prepare: Callable[[dict[str, Any], dict[str, list[int]] | None, list[str]], dict[str, Any]] = (
        lambda p, c, agents: {})
    min_agents: int = 2
    fused: FusedFn | None = None

    def resolve_params(self, given: dict[str, Any]) -> dict[str, Any]:
        """Fill defaults, coerce types and validate; unknown or invalid values raise a clear error."""
        known = {p.name: p for p in self.params}
        unknown = sorted(k for k, v in given.items() if v is not None and k not in known)
        if unknown:
            raise RamStudioError(f"method {self.name!r} does not take {', '.join(unknown)}.",
                                 f"Its parameters are: {', '.join(known) or 'none'}.")
        out: dict[str, Any] = {}
        for p in self.params:
            value = given.get(p.name)
            value = p.default if value is None else value
            try:
                value = p.kind(value) if value is not None else None
            except (TypeError, ValueError):
                raise RamStudioError(f"{p.name}={value!r} is not a valid {p.kind.__name__}.", p.help) from None
            if isinstance(value, float) and not math.isfinite(value):
                raise RamStudioError(f"{p.name} must be a finite number, got {value}.", p.help)
            problem = p.check(value) if (p.check and value is not None) else None
            if problem:
                raise RamStudioError(f"invalid {p.name}={value}: {problem}.", p.help)
            out[p.name] = value
        return out


def f32(x: float) -> float:
    """Round a scalar to float32: ε, p and λ are used as float32 values by both the torch and the
    kernel paths, so a comparison never depends on how a backend promotes a Python float."""
    return float(np.float32(x))


def non_negative(v: float) -> str | None:
    return None if v >= 0 else "must be ≥ 0"


def in_unit_open_closed(v: float) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


def in_unit_closed_open(v: float) -> str | None:
    return None if 0 <= v < 1 else "must be in [0, 1)"


def boolean(v: Any) -> bool:
    """Parse a yes/no parameter given as bool or text."""
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(v)

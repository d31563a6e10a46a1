"""How a method maps onto mergekit 0.1.5 configs, declared in the method's own file.

A method's `mergekit` field (a `Mergekit`) says how the method is written as a mergekit config (`write`:
our parameters and the number of agents → a `MergekitEquivalent`, exact or only the nearest one) and which
mergekit methods it reads (`reads`: mergekit's name, its global defaults, its per-model parameter names,
and a `translate` from a `MergekitInput` to our parameters). `merging.interop.mergekit` does the YAML,
the top-level fields, the model references and the dtypes, and asks the registry for the rest. The
refusal helpers here give every refusal the same one-line form.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from merging.common.errors import RamStudioError, printable


def refuse(what: str, hint: str = "") -> RamStudioError:
    """The error for a config RAM Studio would not reproduce faithfully, naming the field."""
    return RamStudioError(f"mergekit config: {what}.",
                          hint or "RAM Studio runs only what it reproduces faithfully; change or remove that field.")


@dataclass(frozen=True)
class MergekitEquivalent:
    """The mergekit config a merge is written as: `method`, its global `parameters`, the `model_parameters`
    every model gets (none when empty), and a `note` on what differs. With `exact` False no mergekit config
    computes this merge: `note` says why, and this is the nearest config."""

    method: str
    parameters: dict[str, Any]
    model_parameters: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    exact: bool = True


@dataclass
class MergekitInput:
    """A mergekit config being read, as a `translate` function sees it: mergekit's `method`, the `agents`
    (reference, per-model parameters; the base left out), the global `parameters` (mergekit's defaults
    filled in), whether the base is `base_listed` among the models, and the `notes` to add to."""

    method: str
    agents: list[tuple[str, dict[str, Any]]]
    parameters: dict[str, Any]
    base_listed: bool
    notes: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.agents)

    def equal(self, values: list[Any], what: str) -> Any:
        """The one value every agent has; differing per-model values are refused."""
        if len(set(values)) > 1:
            raise refuse(f"per-model {what} differ ({', '.join(str(v) for v in values)})",
                         f"RAM Studio's {self.method} uses one {what} for every agent; give them all the same value.")
        return values[0]

    def weight(self) -> Any:
        """The models' common, positive weight (mergekit requires one per model for weighted methods)."""
        weights = [p.get("weight") for _, p in self.agents]
        if any(w is None for w in weights):
            raise refuse(f"every model needs a weight for {self.method} (mergekit requires it)")
        w = self.equal(weights, "weights")
        if w <= 0:
            raise refuse(f"weight {w} must be positive")
        return w

    def density(self) -> Any:
        """The models' common density (mergekit's default 1.0 where a model gives none)."""
        return self.equal([p.get("density", 1.0) for _, p in self.agents], "densities")

    def no_weights(self) -> None:
        """Refuse weights other than 1 for a mergekit method that ignores them."""
        for ref, p in self.agents:
            if p.get("weight", 1) != 1:
                raise refuse(f"weight {p['weight']} for {printable(ref, 60)}: mergekit's {self.method} ignores weights",
                             "Remove the weights (RAM Studio refuses rather than guess).")


@dataclass(frozen=True)
class MergekitRead:
    """A mergekit method this method reads: mergekit's `name`, its global parameters with mergekit's
    `defaults` (in the order they are checked), its `per_model` parameter names, and `translate`, which
    returns our parameters or raises `refuse(...)` for what we would compute differently."""

    name: str
    defaults: dict[str, Any]
    per_model: frozenset[str]
    translate: Callable[[MergekitInput], dict[str, Any]]


@dataclass(frozen=True)
class Mergekit:
    """A method's mergekit mapping: how it is `write`-n (params, n_agents → MergekitEquivalent) and the
    mergekit methods it `reads`."""

    write: Callable[[dict[str, Any], int], MergekitEquivalent]
    reads: tuple[MergekitRead, ...] = ()


# mergekit's global parameters of its generalized task arithmetic methods (lambda, normalize, int8_mask,
# rescale), with its defaults for the plain weighted sum; each method overrides what differs.
GTA_DEFAULTS = {"lambda": 1.0, "normalize": False, "int8_mask": False, "rescale": False}

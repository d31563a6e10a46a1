"""A mergekit YAML config read into what a merge form holds: the method, a value for every one of its parameters
(the YAML's, else the declared default), the models and the output options.

The app's Merge page loads a pasted or uploaded config with it (the page only writes the values into its
widgets); the parsing, its bounds and its checks are merging.interop.mergekit's, shared with `ram-studio run`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from merging.methods import get_method
from merging.recipe import MergeSpec


@dataclass(frozen=True)
class MergeForm:
    """A merge as a form shows it."""

    spec: MergeSpec  # method, models (base, agents in the YAML's order), out, out_dtype, shard_size, on_mismatch
    values: dict[str, Any]  # every parameter of spec.method, as its input holds it (form_values)

    @property
    def summary(self) -> str:
        """The parameters the config set, as `k=v, …` (or "no parameters")."""
        return ", ".join(f"{k}={v}" for k, v in self.spec.params.items()) or "no parameters"


def form_values(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A value for every parameter of `method` as a form input holds it: the given one, else the declared
    default; an unset text parameter is the empty string (an empty text box)."""
    out = {}
    for p in get_method(method).params:
        value = params.get(p.name, p.default)
        out[p.name] = "" if (p.kind is str and value is None) else value
    return out


def read_mergekit_form(text: str) -> MergeForm:
    """Parse and check a mergekit YAML config (RamStudioError with one readable line when it is not one RAM
    Studio can run) and translate it into form values."""
    from merging.interop.mergekit import parse_mergekit_yaml

    spec = parse_mergekit_yaml(text)
    return MergeForm(spec, form_values(spec.method, spec.params))

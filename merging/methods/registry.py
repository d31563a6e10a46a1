"""The method registry: every merge method registers itself by name, like mergekit's registry."""
from __future__ import annotations

from merging.common.errors import RamStudioError
from merging.methods.base import MergeMethod
from merging.methods.params import Param

METHODS: dict[str, MergeMethod] = {}


def register(method: MergeMethod) -> MergeMethod:
    """Add a method to the registry (names are unique; a parameter name means one thing everywhere)."""
    if method.name in METHODS:
        raise ValueError(f"method {method.name} registered twice")
    if method.side_tensors is not None and (method.fused is not None or method.kernels or method.passes({})):
        raise ValueError(f"method {method.name} reads side tensors: the engine streams them on the torch path of a "
                         "merge without passes (no fused kernel, no passes)")
    for p in method.params:
        other = all_params().get(p.name)
        if other is not None and other != p:
            raise ValueError(f"parameter {p.name} of {method.name} is declared differently elsewhere: "
                             "declare it once and share it")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> MergeMethod:
    """Look a method up by name, with a readable error listing the known ones."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise RamStudioError(f"unknown merge method {str(name)[:40]!r}.",
                             f"Known methods: {', '.join(sorted(METHODS))}.") from None


def all_params() -> dict[str, Param]:
    """Every parameter of every registered method, by name (one declaration per name)."""
    out: dict[str, Param] = {}
    for m in METHODS.values():
        for p in m.params:
            out.setdefault(p.name, p)
    return out


def methods_taking(name: str) -> list[str]:
    """Names of the methods that take parameter `name`."""
    return [m.name for m in METHODS.values() if any(p.name == name for p in m.params)]

"""The method registry: every merge method registers itself by name here, like mergekit's registry."""
from __future__ import annotations

from ..errors import RamStudioError
from .base import ChunkContext, MergeMethod, Param, TensorPass

METHODS: dict[str, MergeMethod] = {}


def register(method: MergeMethod) -> MergeMethod:
    """Add a method to the registry (names are unique)."""
    if method.name in METHODS:
        raise ValueError(f"method {method.name} registered twice")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> MergeMethod:
    """Look a method up by name, with a readable error listing the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise RamStudioError(f"unknown merge method {name!r}.",
                             f"Known methods: {', '.join(sorted(METHODS))}.") from None


# Importing the modules registers their methods.
from . import dare, linear, ram, ties, unique_only  # noqa: E402,F401

__all__ = ["METHODS", "ChunkContext", "MergeMethod", "Param", "TensorPass", "get_method", "register"]

"""Merge methods. Each module of this package defines and registers its methods; adding a method means
adding one file here (its function and its parameters), which is imported below automatically."""
from __future__ import annotations

import importlib
import pkgutil

from merging.methods.base import ChunkContext, MergeMethod, TensorPass
from merging.methods.params import Param
from merging.methods.registry import METHODS, all_params, get_method, methods_taking, register

_INFRASTRUCTURE = {"base", "params", "registry", "regions", "mergekit_map", "whole"}
_FIRST = ["ram", "linear", "ties", "dare"]  # the order users see them in (RAM first); the rest follow by name
for _name in _FIRST + sorted(i.name for i in pkgutil.iter_modules(__path__)):
    if _name not in _INFRASTRUCTURE:
        importlib.import_module(f"{__name__}.{_name}")

__all__ = ["METHODS", "ChunkContext", "MergeMethod", "Param", "TensorPass", "all_params", "get_method",
           "methods_taking", "register"]

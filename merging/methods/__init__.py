"""Merge methods. Each module of this package defines and registers its methods; adding a method means
adding one file here (its function and its parameters), which is imported below automatically."""
from __future__ import annotations

import importlib
import pkgutil

from .base import ChunkContext, MergeMethod, TensorPass
from .params import Param
from .registry import METHODS, all_params, get_method, methods_taking, register

_INFRASTRUCTURE = {"base", "params", "registry"}
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
    if _info.name not in _INFRASTRUCTURE:
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["METHODS", "ChunkContext", "MergeMethod", "Param", "TensorPass", "all_params", "get_method",
           "methods_taking", "register"]

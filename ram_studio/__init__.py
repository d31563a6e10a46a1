"""RAM Studio: analyse and merge RL-trained agents (Reinforced Agent Merging, arXiv 2601.13572).

The Python API — `from ram_studio import analyze, merge, evaluate, sweep` — takes models as the CLI does
("demo:code", a folder, a Hub id) and the CLI's flags as keywords; docs/python-api.md shows it. This package is
also the command line (`ram-studio`, `python -m ram_studio`): the top layer, which may use every package below
it (analysis, merging), the bundled demo (demo) and the app's figure builders (app.charts). Importing it is
light: the API's modules, and torch with them, load on first use.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.2.0"  # the one declaration of the version (pyproject.toml reads it; `ram-studio --version`)
_API = {"analyze": "ram_studio.api.analyze", "merge": "ram_studio.api.merge", "evaluate": "ram_studio.api.evaluate",
        "sweep": "ram_studio.api.sweep", "toy": "ram_studio.api.demo", "fig3": "ram_studio.api.demo",
        "Progress": "ram_studio.api.progress", "RamStudioError": "merging.common.errors"}
__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    """The API's names, imported when first used (so `import ram_studio` and `ram-studio --help` stay instant)."""
    if name not in _API:
        raise AttributeError(f"module 'ram_studio' has no attribute {name!r}")
    import importlib

    from merging.common.threads import openmp_waits_passively

    openmp_waits_passively()  # the API's first use starts a command: before its modules load torch
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)

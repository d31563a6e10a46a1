"""The installed RAM Studio's version, for the provenance every output records (recipes, scores, Fisher caches).

The version is declared once, as `ram_studio.__version__` (the package named after the command); the layers below
the CLI read it from the installed distribution's metadata, so that they never import the layer above them.
"""
from __future__ import annotations

import functools
from importlib import metadata

DISTRIBUTION = "ram-studio"


@functools.lru_cache(maxsize=1)
def ram_studio_version() -> str:
    """The installed distribution's version (`ram_studio.__version__` when it was installed); "unknown" when this
    code runs from a checkout that was never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"

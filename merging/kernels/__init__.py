"""Fused CPU kernels (numba): one pass per element instead of one torch op per step.

Each kernel reproduces, bit for bit, the float32 arithmetic of the matching torch code in
`merging.methods` (same operations in the same order), which stays the reference and the GPU path;
tests compare the two. Set RAM_STUDIO_KERNELS=torch to force the torch path on the CPU.
"""
from __future__ import annotations

import os

try:  # numba is a dependency, but the torch path keeps everything working without it
    import numba  # noqa: F401

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only where numba cannot be installed
    HAVE_NUMBA = False


def kernels_enabled() -> bool:
    """Whether CPU work should use the fused kernels (numba present and not disabled)."""
    return HAVE_NUMBA and os.environ.get("RAM_STUDIO_KERNELS", "numba").lower() != "torch"

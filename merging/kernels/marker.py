"""Where a completed warm-up of the kernels is noted (see merging.kernels.prepare)."""
from __future__ import annotations

import os
from importlib import metadata


def marker_path(dtype: str, kernel: str | None = None) -> str:
    """A file next to numba's cache of these kernels, named after the kernel source's stamp (numba's own
    invalidation rule) and numba's version: present once every kernel of `dtype` (or the one `kernel`) was
    cached."""
    here = os.path.join(os.path.dirname(__file__), "cpu.py")
    st = os.stat(here)
    try:  # numba's version without importing numba
        version = metadata.version("numba")
    except metadata.PackageNotFoundError:  # pragma: no cover - numba missing: no kernels anyway
        version = "none"
    cache_dir = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(os.path.dirname(__file__), "__pycache__")
    what = f"kernels-{dtype}" if kernel is None else f"kernel-{kernel}-{dtype}"
    return os.path.join(cache_dir, f"ram-studio-{what}-{version}-{int(st.st_mtime)}-{st.st_size}.ready")

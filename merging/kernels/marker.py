"""Where a completed warm-up of the kernels is noted (see merging.kernels.prepare)."""
from __future__ import annotations

import hashlib
import os
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))


def source_stamp() -> str:
    """numba's invalidation rule (a source file's mtime and size) over every kernel source file at once:
    the kernels inline helpers from other files of this folder, so a change to any of them counts."""
    parts = []
    for name in sorted(os.listdir(HERE)):
        if name.endswith(".py"):
            st = os.stat(os.path.join(HERE, name))
            parts.append(f"{name}:{int(st.st_mtime)}:{st.st_size}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def marker_path(dtype: str, kernel: str | None = None) -> str:
    """A file next to numba's cache of these kernels, named after the kernel sources' stamp and numba's
    version: present once every kernel of `dtype` (or the one `kernel`) was cached."""
    try:  # numba's version without importing numba
        version = metadata.version("numba")
    except metadata.PackageNotFoundError:  # pragma: no cover - numba missing: no kernels anyway
        version = "none"
    cache_dir = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(HERE, "__pycache__")
    what = f"kernels-{dtype}" if kernel is None else f"kernel-{kernel}-{dtype}"
    return os.path.join(cache_dir, f"ram-studio-{what}-{version}-{source_stamp()}.ready")

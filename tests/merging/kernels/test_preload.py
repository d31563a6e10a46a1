"""merging.kernels.preload: a long-lived process loads, in the background, the kernels of every dtype numba has on
disk, and never starts a compile (with an empty cache it asks for nothing and numba is not even imported)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from merging.kernels import DTYPES, cached_marker_exists, kernels_enabled
from tests.paths import REPO_ROOT

SCRIPT = """
import os, sys, threading
from merging import kernels
os.environ["NUMBA_CACHE_DIR"] = sys.argv[1]  # an empty cache: nothing compiled
assert kernels.preload() == (), "asked for kernels with nothing on disk"
assert "numba" not in sys.modules and not any(t.name == "ram-kernels" for t in threading.enumerate())
del os.environ["NUMBA_CACHE_DIR"]  # the checkout's cache, filled when the session started
dtypes = kernels.preload()
assert dtypes == tuple(sys.argv[2].split(",")), dtypes
assert kernels.wait_ready(kernels.ALL, dtypes, timeout=120)
assert all(kernels.ready(kernels.ALL, d) for d in dtypes)
print("ok")
"""


@pytest.mark.skipif(not kernels_enabled(), reason="numba kernels are off")
def test_preload_loads_what_is_compiled_and_never_compiles(tmp_path):
    on_disk = [d for d in DTYPES if cached_marker_exists(d)]
    assert on_disk, "the session compiles every kernel before the tests (tests/conftest.py)"
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), ",".join(on_disk)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]

"""How the process's thread pools behave, set where a command starts (the CLI, the app, the Python API, a test
run), never on import: a library must not change the environment of the program that imports it."""
from __future__ import annotations

import os

WAIT_POLICY = "OMP_WAIT_POLICY"


def openmp_waits_passively() -> None:
    """Let OpenMP threads (numba's parallel kernels, torch's intra-op pool) sleep instead of spinning between
    parallel regions: spinning takes the cores the reader, writer and compute threads need (measured: a 2-core
    analysis used 45 s of CPU instead of 16). OpenMP reads the setting when its runtime loads, so this must run
    before torch or numba are imported; a value already in the environment (the user's) is kept."""
    os.environ.setdefault(WAIT_POLICY, "PASSIVE")

"""RAM Studio's merging library: model references and checkpoint I/O, the changed/shared/unique rule, merge
methods and kernels, the streaming engine, the counting pass for global ρ, safe export and recipes."""

import os

__version__ = "0.2.0"

# OpenMP threads (numba's parallel kernels, torch's intra-op pool) sleep instead of spinning between
# parallel regions: spinning takes the cores the reader, writer and compute threads need (measured: a
# 2-core analysis used 45 s of CPU instead of 16). Set before torch or numba load their OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

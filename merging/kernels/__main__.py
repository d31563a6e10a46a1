"""`python -m merging.kernels`: compile (or load) every kernel now, e.g. while building an image, so that
no run ever uses the slower torch path while numba compiles in the background."""
import sys
import time

from merging.kernels import kernels_enabled, wait_ready, warmup_log

if not kernels_enabled():
    print("numba kernels are disabled or numba is missing; nothing to compile.")
    sys.exit(0)
t = time.perf_counter()
if not wait_ready():
    print("compiling the kernels failed; the torch path will be used.", file=sys.stderr)
    sys.exit(1)
print("\n".join(warmup_log()))
print(f"kernels ready in {time.perf_counter() - t:.1f} s")

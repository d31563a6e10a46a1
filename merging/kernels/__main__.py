"""`python -m merging.kernels [KERNEL ...]`: compile (or load) the kernels now (all of them by default), e.g.
while building an image, so that no run ever uses the slower torch path while numba compiles in the background.
Naming kernels splits the work: two processes given disjoint names compile side by side (each kernel has its own
cache files, so they never write the same one)."""
import sys
import time

from merging.kernels import ALL, kernels_enabled, wait_ready, warmup_log

names = tuple(sys.argv[1:]) or ALL
unknown = [n for n in names if n not in ALL]
if unknown:
    print(f"unknown kernel {ascii(unknown[0])}; the kernels are: {', '.join(ALL)}", file=sys.stderr)
    sys.exit(2)
if not kernels_enabled():
    print("numba kernels are disabled or numba is missing; nothing to compile.")
    sys.exit(0)
t = time.perf_counter()
if not wait_ready(names):
    print("compiling the kernels failed; the torch path will be used.", file=sys.stderr)
    sys.exit(1)
print("\n".join(warmup_log()))
print(f"kernels ready in {time.perf_counter() - t:.1f} s")

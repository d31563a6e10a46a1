"""What the precision statistics cost inside the analysis kernel: the joint-state histogram kernel of a git
revision (before) against this tree's (after), on the same chunks, interleaved in one process.

    python -m tests.benchmarks.precision_cost --before REV [--elems 8388608] [--agents 3] [--runs 7] [--out FILE]

The before kernel (merging/kernels/statistics.py at REV) is loaded as its own module from a temporary copy and
compiled there; both read the same bf16 chunk (base N(0, 0.02); each agent moves a random 40 % of the elements by
one or two bf16 steps, as real RL checkpoints stored in bf16 do) and a float32 copy of it, with the default
ladder. Reported: median seconds per call of each, and their ratio; the whole cold `analyze` is
`ab_analyze.py`'s job. Timings on a shared machine are noisy: compare ratios from one run.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def load_before(rev: str, tmp: Path):
    """merging/kernels/statistics.py at `rev` as module `before_statistics` (its own numba cache in `tmp`)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:merging/kernels/statistics.py"], check=True,
                         capture_output=True, text=True).stdout
    path = tmp / "before_statistics.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("before_statistics", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # numba's cache finds the module by name
    spec.loader.exec_module(mod)
    return mod


def chunk(elems: int, agents: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """bf16 bit patterns (uint16): a base and agents moved by one or two steps on 40 % of the elements."""
    g = np.random.default_rng(seed)
    base = (g.standard_normal(elems, dtype=np.float32) * 0.02).view(np.uint32)
    base = ((base + 0x7FFF + ((base >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even bf16
    out = np.empty((agents, elems), np.uint16)
    for t in range(agents):
        moved = g.random(elems) < 0.4
        step = g.integers(1, 3, elems) * np.where(g.random(elems) < 0.5, -1, 1)
        mag = (base & 0x7FFF).astype(np.int32) + moved * step
        out[t] = (base & 0x8000) | np.clip(mag, 0, 0x7F7F).astype(np.uint16)
    return base, out


def widen(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git revision whose kernel is 'before'")
    ap.add_argument("--elems", type=int, default=1 << 23)
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    from analysis.ladder import DEFAULT_LADDER, DOMINANCE
    from analysis.precision import format_tables
    from merging.kernels.common import hist_parts
    from merging.kernels.statistics import overlap_histogram as after

    tmp = Path(tempfile.mkdtemp(prefix="ram-prec-bench-"))
    before = load_before(args.before, tmp).overlap_histogram
    ladder, fr = np.array(DEFAULT_LADDER, np.float32), np.array(DOMINANCE)
    results = {}
    for dtype, code in (("bf16", "BF16"), ("f32", "F32")):
        b, a = chunk(args.elems, args.agents)
        if dtype == "f32":
            b, a = widen(b), np.stack([widen(x) for x in a])
        ft = format_tables(code, tuple(float(x) for x in ladder), False)
        parts = hist_parts(b.size)
        calls = {"before": lambda: before(b, a, ladder, fr, parts),
                 "after": lambda: after(b, a, ladder, fr, parts, False, ft.thr, ft.binmap, ft.step32, ft.min_field)}
        for fn in calls.values():  # compile / load, and warm the caches
            fn()
        times: dict[str, list[float]] = {"before": [], "after": []}
        for i in range(args.runs):
            for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
                t0 = time.perf_counter()
                calls[name]()
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        results[dtype] = {"median_s": med, "ratio_after_before": med["after"] / med["before"], "runs": times}
        print(f"{dtype}: before {med['before']:.3f} s, after {med['after']:.3f} s per {args.elems:,}-element chunk "
              f"× {args.agents} agents (after/before {med['after'] / med['before']:.2f})", flush=True)
    doc = {"before": args.before, "elems": args.elems, "agents": args.agents, "load": os.getloadavg(),
           "threads": __import__("numba").get_num_threads(), "results": results}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

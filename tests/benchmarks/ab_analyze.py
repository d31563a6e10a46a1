"""A/B of a cold `analyze` between two versions of the code, interleaved on one machine.

    python -m tests.benchmarks.ab_analyze --before REV [--after REV] --set demo|DIR [--runs 6] [--out FILE]

`--before` (and `--after`, default: this working tree) are git revisions, exported with `git archive` into a
temporary folder (removed at the end) and run with that folder first on PYTHONPATH. `--set demo` is the bundled
demo; a folder is a make_checkpoints set (base, agent_*). Each version first compiles its numba kernels into
its own cache; then the two run `analyze BASE AGENTS --no-cache --quiet` alternately (each with an empty
analysis cache), and the medians of wall time and of user + system CPU (os.wait4) are reported, with every
run. Used to measure what computing the shared-region diagnostics in the pass costs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def export(rev: str, dst: Path) -> Path:
    """The tree of `rev` in `dst` (git archive | tar)."""
    dst.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dst)], input=archive, check=True)
    return dst


def models(spec: str) -> list[str]:
    if spec == "demo":
        return ["demo:base", "demo:code", "demo:tool", "demo:memory"]
    folder = Path(spec).resolve()
    return [str(folder / "base"), *sorted(str(p) for p in folder.glob("agent_*"))]


def run_once(tree: Path, refs: list[str], cache: Path) -> tuple[float, float]:
    """Wall seconds and user + system CPU seconds of one cold analyze in `tree`."""
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(tree), "RAM_STUDIO_CACHE": str(cache)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ram_studio", "analyze", *refs, "--no-cache", "--quiet"],
                            cwd=tree, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"analyze failed in {tree}")
    return wall, usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git revision of the 'before' code")
    ap.add_argument("--after", help="git revision of the 'after' code (default: this working tree)")
    ap.add_argument("--set", default="demo", help="demo, or a make_checkpoints folder (base, agent_*)")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    refs = models(args.set)
    tmp = Path(tempfile.mkdtemp(prefix="ram-ab-"))
    try:
        trees = {"before": export(args.before, tmp / "before"),
                 "after": export(args.after, tmp / "after") if args.after else ROOT}
        for tree in trees.values():  # compile (or load) each version's kernels before timing
            subprocess.run([sys.executable, "-m", "merging.kernels"], cwd=tree, check=True,
                           env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.DEVNULL)
        runs: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
        for i in range(args.runs):
            for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
                runs[name].append(run_once(trees[name], refs, tmp / "cache"))
                print(f"run {i + 1} {name}: {runs[name][-1][0]:.2f} s wall, {runs[name][-1][1]:.2f} s CPU", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary: dict = {name: {"median_wall_s": statistics.median(w for w, _ in r),
                            "median_cpu_s": statistics.median(c for _, c in r),
                            "runs": [{"wall_s": round(w, 3), "cpu_s": round(c, 3)} for w, c in r]}
                     for name, r in runs.items()}
    summary.update(revisions={"before": args.before, "after": args.after or "working tree"}, set=args.set,
                   load_average_after=os.getloadavg(), when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    for name in ("before", "after"):
        print(f"{name}: median {summary[name]['median_wall_s']:.2f} s wall, {summary[name]['median_cpu_s']:.2f} s CPU")
    print(f"after / before: wall {summary['after']['median_wall_s'] / summary['before']['median_wall_s']:.2f}, "
          f"CPU {summary['after']['median_cpu_s'] / summary['before']['median_cpu_s']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

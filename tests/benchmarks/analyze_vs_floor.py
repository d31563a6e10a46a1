"""A cold `analyze` against the read floor F, side by side in one run.

    python -m tests.benchmarks.analyze_vs_floor SET [SET ...] [--runs 5] [--compare OTHER_CHECKOUT] [--out FILE]

SET is a folder holding a base and its agents (`base` plus `agent_*` or `a`, `b`, `c`: the sets of
make_checkpoints.py, many_tensors.py and moe_shaped.py). For each set, run by run and interleaved: F (read every
input tensor once through `safe_open` and convert it to float32, tests/benchmarks/floor.py, in a fresh process)
and a cold `ram-studio analyze` (a fresh process, an empty analysis cache that it then writes, as a user's first
analysis does), and with `--compare` the same `analyze` from another checkout. Each row: wall time, user + system
CPU, peak resident memory (from wait4), the load average when it started, and for `analyze` its timeline
(RAM_STUDIO_TIMELINE: where the time goes). Printed: per run the ratios analyze / F (F of the same run), and the
medians. A run killed from outside (exit 137) is run again, and says so.
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


def models(folder: Path) -> list[Path]:
    """base first, then the agents, of a benchmark set."""
    agents = sorted(p for p in folder.iterdir() if p.is_dir() and p.name != "base" and (p / "config.json").exists())
    return [folder / "base", *agents]


def measure(argv: list[str], env: dict[str, str]) -> dict:
    """Wall, CPU and peak RSS of one command in a fresh process (retried when killed from outside)."""
    for attempt in range(1, 6):
        la = os.getloadavg()[0]
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        err = proc.stderr.read()
        code = os.waitstatus_to_exitcode(status)
        if code == -9 or code == 137:
            print(f"  (killed from outside, attempt {attempt}; running it again)", flush=True)
            continue
        if code != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({code}):\n{err[-2000:]}")
        timeline = [line.split("timeline:", 1)[1].strip() for line in err.splitlines() if "timeline:" in line]
        return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                "peak_rss_mb": round(usage.ru_maxrss / 1024), "load": round(la, 2), "retries": attempt - 1,
                **({"timeline": timeline} if timeline else {})}
    raise SystemExit(f"{' '.join(argv)} was killed five times")


def one_run(folder: Path, compare: str | None) -> dict:
    files = [str(p) for p in models(folder)]
    row = {"floor": measure([sys.executable, "-m", "tests.benchmarks.floor", *files], dict(os.environ))}
    trees = [("analyze", None)] + ([("analyze (compare)", compare)] if compare else [])
    for label, tree in trees:
        cache = tempfile.mkdtemp(prefix="analyze-vs-floor-")
        env = {**os.environ, "RAM_STUDIO_CACHE": cache, "RAM_STUDIO_TIMELINE": "1"}
        if tree:
            env["PYTHONPATH"] = str(Path(tree).resolve())
        row[label] = measure([sys.executable, "-m", "ram_studio", "analyze", *files, "--quiet"], env)
        shutil.rmtree(cache, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sets", nargs="+")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--compare", help="another checkout whose analyze runs beside this one's")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    out = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cores": os.cpu_count(), "sets": {}}
    for s in args.sets:
        folder = Path(s)
        runs = []
        for i in range(args.runs):
            row = one_run(folder, args.compare)
            runs.append(row)
            f = row["floor"]["wall_s"]
            ratios = {k: round(v["wall_s"] / f, 2) for k, v in row.items() if k != "floor"}
            print(f"{folder.name} run {i + 1}: F {f} s (load {row['floor']['load']}), "
                  + ", ".join(f"{k} {row[k]['wall_s']} s = {r} × F, {row[k]['cpu_s']} s CPU, "
                              f"{row[k]['peak_rss_mb']} MB" for k, r in ratios.items()), flush=True)
        med = {k: statistics.median(r[k]["wall_s"] for r in runs) for k in runs[0]}
        per_run = [round(r["analyze"]["wall_s"] / r["floor"]["wall_s"], 2) for r in runs]
        out["sets"][str(folder)] = {"runs": runs, "median_s": med, "analyze_over_floor_per_run": per_run}
        print(f"{folder.name}: medians {med}; analyze / F per run {per_run}; "
              f"peak RSS {max(r['analyze']['peak_rss_mb'] for r in runs)} MB")
    out["finished_load"] = round(os.getloadavg()[0], 2)
    print(f"load average now {out['finished_load']} ({os.cpu_count()} cores)")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

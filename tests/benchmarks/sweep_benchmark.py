"""Benchmark of the mini-Table-1 search: `ram-studio sweep`'s in-memory path against the old `table1.py` path
(52 CLI merges in subprocesses, each written, loaded back and scored) and against one `ram-studio evaluate`.

    python -m tests.benchmarks.sweep_benchmark [--json FILE] [--skip-old] [--repeat-evaluate 3]

Runs, one after the other, each as its own process (wall time and peak memory of the process tree from /proc):
1. `ram-studio evaluate demo:tool --split test` (`--repeat-evaluate` times; the median is the unit);
2. the new path: `python -m demo.table1 --no-resume` (45 validation candidates, then the 7 chosen and
   the base and 3 agents on test), scores stored in a fresh folder;
3. the old path: `python -m tests.benchmarks.table1_subprocess` (skipped with --skip-old).
Then it compares the tables the two paths wrote with each other and with the committed results/table1.csv,
and writes everything (times, ratios, load average before and after, commit) as JSON (default:
.bench/sweep-<date>.json). The machine may be shared: the load average says how much.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .procmon import run_measured

REPO = Path(__file__).resolve().parent.parent.parent
RESULTS = REPO / "assets" / "demo" / "results"
TABLES = ("table1.csv", "table1_validation_search.csv")


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + (" (modified)" if dirty else "")
    except OSError:
        return "unknown"


def _same(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()


def _measure(argv: list[str], log: Path, env: dict[str, str]) -> dict:
    m = run_measured(argv, log_path=str(log), env=env, cwd=str(REPO)).to_dict()
    m["load_after"] = os.getloadavg()
    if m["rc"] != 0:
        raise SystemExit(f"{' '.join(argv)} failed (rc {m['rc']}); see {log}")
    return m


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.sweep_benchmark",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="where to write the results (default .bench/…)")
    parser.add_argument("--skip-old", action="store_true", help="do not run the old subprocess path (~5 min)")
    parser.add_argument("--repeat-evaluate", type=int, default=3)
    args = parser.parse_args(argv)
    out = args.json or REPO / ".bench" / f"sweep-{time.strftime('%Y-%m-%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    cli = str(Path(py).with_name("ram-studio"))
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "RAM_STUDIO_SWEEP_CACHE": str(work / "store"), "RAM_STUDIO_CACHE": str(work / "analysis")}
        doc: dict = {"commit": _commit(), "python": platform.python_version(), "cpus": os.cpu_count(),
                     "load_before": os.getloadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        evals = [_measure([cli, "evaluate", "demo:tool", "--split", "test"], work / f"evaluate{i}.log", env)
                 for i in range(args.repeat_evaluate)]
        unit = statistics.median(m["wall_s"] for m in evals)
        doc["evaluate"] = {"runs": evals, "median_s": unit}
        print(f"one `ram-studio evaluate` on test: {unit:.1f} s (median of {len(evals)})", flush=True)
        new = _measure([py, "-m", "demo.table1", "--out", str(work / "new"), "--no-resume"], work / "new.log",
                       env)
        doc["new"] = {**new, "times_evaluate": new["wall_s"] / unit}
        print(f"new path (in-memory sweep): {new['wall_s']:.1f} s = {new['wall_s'] / unit:.1f} × evaluate", flush=True)
        doc["new"]["same_as_committed"] = {t: _same(work / "new" / t, RESULTS / t) for t in TABLES}
        stored = [json.loads(f.read_text())["result"] for f in (work / "store").glob("*.json")]
        doc["new"]["scorings"] = len(stored)  # where the sweep's time went, from its stored scores
        doc["new"]["merge_s_total"] = sum(r.get("merge_s", 0.0) for r in stored)
        doc["new"]["eval_s_total"] = sum(r.get("eval_s", 0.0) for r in stored)
        if not args.skip_old:
            old = _measure([py, "-m", "tests.benchmarks.table1_subprocess", "--out", str(work / "old")],
                           work / "old.log", env)
            doc["old"] = {**old, "times_evaluate": old["wall_s"] / unit,
                          "same_as_committed": {t: _same(work / "old" / t, RESULTS / t) for t in TABLES}}
            doc["speedup"] = old["wall_s"] / new["wall_s"]
            doc["new_equals_old"] = {t: _same(work / "new" / t, work / "old" / t) for t in TABLES}
            print(f"old path (subprocess merges): {old['wall_s']:.1f} s = {old['wall_s'] / unit:.1f} × evaluate; "
                  f"speed-up {doc['speedup']:.1f}×; tables equal: {doc['new_equals_old']}", flush=True)
        doc["new"]["log_tail"] = (work / "new.log").read_text(errors="replace").splitlines()[-3:]
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

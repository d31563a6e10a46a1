"""The mini Table 1 as it was computed before `ram-studio sweep` (kept for the sweep benchmark only): 52 merges
through the core CLI in subprocesses, each written to a folder, loaded back and scored.

Same search and outputs as `demo/table1.py` (the paper's Appendix D.2 grid, validation → test).

    python -m tests.benchmarks.table1_subprocess --out DIR [--models assets/demo/models]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from demo.evaluate import evaluate_model, format_table, summary_row
from demo.table1 import save
from demo.tasks import TASKS
from ram_studio.commands.merge import param_flags

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
DEMO_DIR = REPO_ROOT / "assets" / "demo"
AGENTS = TASKS
LAMBDAS = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
DENSITIES = (0.1, 0.2, 0.3)
DROP_RATES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
RAM_DEFAULTS = {"eps": 1e-5, "r": 0.1, "alpha": 2.0}


def merge(models: Path, method: str, out: Path, params: dict[str, object]) -> None:
    """Run the core CLI merge of base + the three agents into `out` in a subprocess (DARE: its default seed 0)."""
    cmd = [sys.executable, "-m", "merging", "merge", str(models / "base"), *[str(models / a) for a in AGENTS],
           "--method", method, "--out", str(out), "--overwrite", "--quiet", *param_flags(params)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"merge failed ({' '.join(cmd)}):\n{proc.stdout}\n{proc.stderr}")


def score(folder: Path, split: str, limit: int | None) -> dict[str, float]:
    """Wide accuracy row (%) for one model folder on one split."""
    return summary_row(evaluate_model(folder, TASKS, split, limit))


def fmt_params(params: dict[str, float]) -> str:
    """Compact `k=v` rendering of a hyper-parameter setting."""
    return " ".join(f"{k}={v}" for k, v in params.items())


class Search:
    """Merge + validation score for each setting, keeping a log of every trial."""

    def __init__(self, models: Path, work: Path, val_limit: int | None) -> None:
        self.models, self.work, self.val_limit = models, work, val_limit
        self.trials: list[dict] = []

    def trial(self, method: str, params: dict[str, float]) -> dict:
        """Merge with `params` and score on validation; returns the trial record."""
        out = self.work / f"{method}-{len(self.trials)}"
        merge(self.models, method, out, params)
        row = score(out, "validation", self.val_limit)
        rec = {"method": method, "params": fmt_params(params), "folder": str(out), **params,
               **{f"val_{k}": v for k, v in row.items()}}
        self.trials.append(rec)
        print(f"  {method:16s} {fmt_params(params):32s} val avg {row['avg']:.2f}", flush=True)
        return rec

    def best(self, method: str, grid: Sequence[dict[str, float]]) -> dict:
        """Best validation average over `grid` (ties: the first, i.e. the smaller setting)."""
        recs = [self.trial(method, p) for p in grid]
        return max(recs, key=lambda r: r["val_avg"])


def run(models: Path, out_dir: Path, val_limit: int | None, test_limit: int | None) -> pd.DataFrame:
    """Build the table; also writes the full validation search log."""
    t0 = time.time()
    rows: list[dict] = []
    for name in ("base",) + AGENTS:
        rows.append({"model": name, "params": "", **score(models / name, "test", test_limit)})
        print(f"  {name}: test avg {rows[-1]['avg']:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="table1-") as tmp:
        search = Search(models, Path(tmp), val_limit)
        chosen = {
            "average": search.best("average", [{}]),
            "task_arithmetic": search.best("task_arithmetic", [{"lambda": lam} for lam in LAMBDAS]),
            "ties": search.best("ties", [{"lambda": lam, "density": d}
                                         for d in DENSITIES for lam in LAMBDAS]),
        }
        ta_lam = chosen["task_arithmetic"]["lambda"]
        ties_lam = chosen["ties"]["lambda"]
        chosen["dare_ta"] = search.best("dare_ta", [{"lambda": ta_lam, "drop_rate": p}
                                                     for p in DROP_RATES])
        # The core CLI's dare_ties has no trim step (drop, elect sign, disjoint mean, λ).
        chosen["dare_ties"] = search.best("dare_ties", [{"lambda": ties_lam, "drop_rate": p}
                                                        for p in DROP_RATES])
        chosen["ram"] = search.best("ram", [{"eps": RAM_DEFAULTS["eps"]}])
        chosen["ram_plus"] = search.best("ram_plus", [dict(RAM_DEFAULTS)])
        for method, rec in chosen.items():
            row = score(Path(rec["folder"]), "test", test_limit)
            rows.append({"model": method, "params": rec["params"], "val_avg": rec["val_avg"], **row})
            print(f"  {method}: test avg {row['avg']:.2f} ({rec['params']})", flush=True)
        trials = pd.DataFrame(search.trials).drop(columns=["folder"])
    table = save(pd.DataFrame(rows), trials, out_dir)  # the same files as the sweep's table1.py writes
    md = format_table(table.set_index("model").drop(columns=["params", "val_avg"]))
    print(md)
    print(f"[table1] done in {time.time() - t0:.0f} s")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.table1_subprocess",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=DEMO_DIR / "models")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--val-limit", type=int, default=None,
                        help="examples per task for the validation search (default: all)")
    parser.add_argument("--test-limit", type=int, default=None)
    args = parser.parse_args(argv)
    run(args.models.resolve(), args.out.resolve(), args.val_limit, args.test_limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Mini Table 1 with the step rule in RAM / RAM+'s grid (our extension): the search of `table1.py`, with RAM and
RAM+ also tried with ε in representable steps of the stored dtype (`table1_step_rule_grids.yaml`), chosen on the
validation split like every other parameter, the chosen candidates scored on the test split.

    python -m assets.demo.table1_step_rule [--models assets/demo/models] [--out assets/demo/results] [--limit N]
    python -m assets.demo.table1_step_rule --models assets/demo/models-shared --out assets/demo/results-shared

Writes table1_step_rule.csv / .md and table1_step_rule_validation_search.csv next to table1's files (which it
leaves as they are).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from evaluation.executors import EXECUTORS
from evaluation.grid import read_grid_file
from evaluation.store import ScoreStore
from evaluation.sweep import SweepResult, SweepSpec, run_sweep

from .evaluate import format_table, suite_of_folder
from .evaluator import DemoEvaluator
from .table1 import AGENTS, DEMO_DIR, tables, trio_name
from .tasks import score_columns

GRIDS = DEMO_DIR / "table1_step_rule_grids.yaml"
NAME = "table1_step_rule"


def sweep(models: Path, limit: int | None = None, executor: str = "local",
          store: ScoreStore | None = None) -> SweepResult:
    """Table 1's search with the step rule in RAM / RAM+'s grid, on the demo tasks, validation → test."""
    spec = SweepSpec(str(models / "base"), [str(models / a) for a in AGENTS], read_grid_file(GRIDS),
                     DemoEvaluator(suite=suite_of_folder(models / "base")), limit=limit)
    return run_sweep(spec, EXECUTORS[executor](), store=store)


def save(res: SweepResult, out_dir: Path, trio: str):
    """table1_step_rule.csv, .md and the validation search; returns the table."""
    table, trials = tables(res)
    table = table[["model", "params", *score_columns(table.columns), "avg", "val_avg"]]
    out_dir.mkdir(parents=True, exist_ok=True)
    trials.to_csv(out_dir / f"{NAME}_validation_search.csv", index=False)
    table.to_csv(out_dir / f"{NAME}.csv", index=False)
    md = format_table(table.set_index("model").drop(columns=["params", "val_avg"]))
    notes = "\n".join(f"- {r.model}: {r.params}" for r in table.itertuples() if r.params)
    ram = trials[trials["method"].isin(["ram", "ram_plus"])]
    search = "\n".join(f"- {r.method} {r.params}: validation average {r.val_avg:.2f}" for r in ram.itertuples())
    (out_dir / f"{NAME}.md").write_text(
        f"Mini Table 1 with the step rule in RAM / RAM+'s grid ({trio}, test split, accuracy %; hyper-parameters "
        "chosen on validation; eps_steps = 0 is the paper's ε = 1e-5)\n\n" + md + "\n\nChosen settings:\n" + notes
        + "\n\nRAM / RAM+ on validation, every rule tried:\n" + search + "\n")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m assets.demo.table1_step_rule",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=DEMO_DIR / "models")
    parser.add_argument("--out", type=Path, default=DEMO_DIR / "results")
    parser.add_argument("--limit", type=int, default=None, help="examples per task and split (default: all)")
    parser.add_argument("--executor", choices=sorted(EXECUTORS), default="local")
    parser.add_argument("--no-resume", action="store_true", help="score everything again (ignore stored scores)")
    args = parser.parse_args(argv)
    t0 = time.time()
    res = sweep(args.models.resolve(), args.limit, args.executor, ScoreStore(read=not args.no_resume))
    table = save(res, args.out.resolve(), trio_name(args.models.resolve()))
    print(format_table(table.set_index("model").drop(columns=["params", "val_avg"])))
    print(f"[{NAME}] done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

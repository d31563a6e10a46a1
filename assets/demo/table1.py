"""Mini Table 1 on the bundled demo: base, agents and every merge method, test-split accuracy.

A sweep definition (`table1_grids.yaml`, the paper's Appendix D.2 grid) run through `ram-studio sweep`'s
code: every candidate is merged in memory and scored on the validation split, each method's best is
chosen there, and only the chosen ones (with the base and the agents) are scored on the test split.

    python -m assets.demo.table1 [--models assets/demo/models] [--out assets/demo/results] [--limit N]
    python -m assets.demo.table1 --models assets/demo/models-shared --out assets/demo/results-shared
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from evaluation.executors import EXECUTORS
from evaluation.grid import read_grid_file
from evaluation.store import ScoreStore
from evaluation.sweep import CANDIDATE, Entry, SweepProgressFn, SweepResult, SweepSpec, run_sweep

from .evaluate import format_table, suite_of_folder
from .evaluator import DemoEvaluator
from .tasks import TASKS

DEMO_DIR = Path(__file__).resolve().parent
AGENTS = TASKS
GRIDS = DEMO_DIR / "table1_grids.yaml"
RAM_DEFAULTS = {"eps": 1e-5, "r": 0.1, "alpha": 2.0}


def sweep(models: Path, limit: int | None = None, executor: str = "local", store: ScoreStore | None = None,
          progress: SweepProgressFn | None = None) -> SweepResult:
    """The Table 1 search: GRIDS over base + the three agents, demo tasks (the suite the base's config names:
    the shared-skill trio is scored with its closing tag), validation → test."""
    spec = SweepSpec(str(models / "base"), [str(models / a) for a in AGENTS], read_grid_file(GRIDS),
                     DemoEvaluator(suite=suite_of_folder(models / "base")), limit=limit)
    return run_sweep(spec, EXECUTORS[executor](), store=store, progress=progress)


def row(e: Entry, prefix: str = "") -> dict[str, float]:
    """Accuracy (%) per task and memory length, and the mean over the tasks: each rounded to 2 decimals."""
    out = {f"{prefix}{k}": round(v, 2) for k, v in {**e.scores, **e.detail}.items()}
    out[f"{prefix}avg"] = round(e.average, 2)
    return out


def tables(res: SweepResult) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(table1: base, agents and each method's chosen candidate on test; every validation trial)."""
    valid = {e.candidate: e for e in res.candidates(res.spec.select_on)}
    rows = [{"model": e.label, "params": "", **row(e)} for e in res.references()]
    for e in res.candidates(res.spec.report_on):
        rows.append({"model": e.method, "params": e.settings, "val_avg": round(valid[e.candidate].average, 2),
                     **row(e)})
    trials = [{"method": e.method, "params": e.settings, **row(e, "val_"),
               **{k: e.params[k] for k in e.candidate.given}} for e in valid.values() if e.kind == CANDIDATE]
    return pd.DataFrame(rows), pd.DataFrame(trials)


def caption(t: pd.DataFrame, model_col: str, agents: list[str]) -> str:
    """What the mini Table 1 shows, read from its own numbers (test accuracy, %): the best merge, where RAM and
    RAM+ stand against averaging and it, and the task where RAM+ keeps least of its agent's score."""
    rows = t.set_index(t[model_col].astype(str))
    if "avg" not in rows:
        return "Test accuracy (%) of every model; each merge's settings were chosen on the validation split."
    merges = [m for m in rows.index if m not in ("base", *agents)]
    avg = rows["avg"]
    out = "Test accuracy (%); each merge's settings were chosen on the validation split."
    if not merges:
        return out
    best = max(merges, key=lambda m: avg[m])
    out += f" Best average: {best} {avg[best]:.1f}."
    ours = [m for m in ("ram_plus", "ram") if m in avg]
    if ours and "average" in avg:
        beat = "above" if all(avg[m] > avg["average"] for m in ours) else "not above"
        out += (" " + " and ".join(f"{'RAM+' if m == 'ram_plus' else 'RAM'} {avg[m]:.1f}" for m in ours)
                + f": {beat} averaging ({avg['average']:.1f})")
        below = [m for m in dict.fromkeys([best, "task_arithmetic"]) if m in avg and m not in ours
                 and avg[m] > max(avg[o] for o in ours)]
        out += (", below " + " and ".join(f"{m} ({avg[m]:.1f})" for m in below) if below else "") + "."
    ram = ours[0] if ours else None
    tasks = [a for a in agents if a in rows.columns and a in rows.index]
    if ram and tasks:
        worst = min(tasks, key=lambda a: rows.at[ram, a] - rows.at[a, a])
        out += (f" On {worst}, {'RAM+' if ram == 'ram_plus' else 'RAM'} keeps {rows.at[ram, worst]:.1f} of the "
                f"{worst} agent's {rows.at[worst, worst]:.1f}"
                + (f" (task arithmetic {rows.at['task_arithmetic', worst]:.1f})" if "task_arithmetic" in rows.index
                   else "") + ".")
    return out


def trio_name(models: Path) -> str:
    """The demo trio a models folder holds, for titles: `demo-shared` for models-shared/, else `demo`."""
    return "demo-shared" if models.name == "models-shared" else "demo"


def save(table: pd.DataFrame, trials: pd.DataFrame, out_dir: Path, trio: str = "demo") -> pd.DataFrame:
    """table1.csv (columns in order), table1.md and table1_validation_search.csv; returns the table."""
    memory = sorted([c for c in table.columns if c.startswith("memory@")], key=lambda c: int(c[7:]))
    table = table[["model", "params", "code", "tool", "memory", *memory, "avg", "val_avg"]]
    out_dir.mkdir(parents=True, exist_ok=True)
    trials.to_csv(out_dir / "table1_validation_search.csv", index=False)
    table.to_csv(out_dir / "table1.csv", index=False)
    md = format_table(table.set_index("model").drop(columns=["params", "val_avg"]))
    notes = "\n".join(f"- {r.model}: {r.params}" for r in table.itertuples() if r.params)
    (out_dir / "table1.md").write_text(
        f"Mini Table 1 ({trio}, test split, accuracy %; hyper-parameters chosen on validation)\n\n"
        + md + "\n\nChosen settings:\n" + notes + "\n")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m assets.demo.table1", description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=DEMO_DIR / "models")
    parser.add_argument("--out", type=Path, default=DEMO_DIR / "results")
    parser.add_argument("--limit", type=int, default=None, help="examples per task and split (default: all)")
    parser.add_argument("--executor", choices=sorted(EXECUTORS), default="local")
    parser.add_argument("--no-resume", action="store_true", help="score everything again (ignore stored scores)")
    args = parser.parse_args(argv)
    t0 = time.time()
    res = sweep(args.models.resolve(), args.limit, args.executor, ScoreStore(read=not args.no_resume))
    table = save(*tables(res), args.out.resolve(), trio_name(args.models.resolve()))
    print(format_table(table.set_index("model").drop(columns=["params", "val_avg"])))
    print(f"[table1] done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

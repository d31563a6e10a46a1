"""Mini Table 1 on the bundled demo: base, agents and every merge method, test-split accuracy.

A sweep definition (`table1_grids.yaml`, the paper's Appendix D.2 grid) run through `ram-studio sweep`'s
code: every candidate is merged in memory and scored on the validation split, each method's best is
chosen there, and only the chosen ones (with the base and the agents) are scored on the test split.

    python -m demo.table1 [--models assets/demo/models] [--out assets/demo/results] [--limit N]
    python -m demo.table1 --models assets/demo/models-shared --out assets/demo/results-shared
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from analysis.noise import plus_minus
from evaluation.executors import EXECUTORS
from evaluation.grid import read_grid_file
from evaluation.store import ScoreStore
from evaluation.sweep import CANDIDATE, Entry, SweepProgressFn, SweepResult, SweepSpec, run_sweep

from . import DATA_DIR
from .evaluate import format_table, suite_of_folder
from .evaluator import DemoEvaluator
from .tasks import TASKS, score_columns

DEMO_DIR = DATA_DIR  # the demo's data: models/, results/, the grids
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


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def row(e: Entry, prefix: str = "") -> dict[str, float | None]:
    """Accuracy (%) per task and memory length, the mean over the tasks, and each one's standard error
    (`…_se`: binomial per task and length, √(Σ se²)/k for the mean): each rounded to 2 decimals."""
    out: dict[str, float | None] = {f"{prefix}{k}": round(v, 2) for k, v in {**e.scores, **e.detail}.items()}
    out[f"{prefix}avg"] = round(e.average, 2)
    out.update({f"{prefix}{k}_se": _r(v) for k, v in {**e.stderr, **e.detail_stderr}.items()})
    out[f"{prefix}avg_se"] = _r(e.average_stderr)
    return out


def examples_of(e: Entry) -> str:
    """Examples per task: one number when every task has as many, else each task's."""
    counts = [e.n.get(t, 0) for t in e.scores]
    return str(counts[0]) if len(set(counts)) == 1 else "/".join(f"{t}:{e.n.get(t, 0)}" for t in e.scores)


def tables(res: SweepResult) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(table1: base, agents and each method's chosen candidate on test, with standard errors; every validation
    trial, with whether it is within noise of the best overall and of its method's chosen)."""
    valid = {e.candidate: e for e in res.candidates(res.spec.select_on)}
    rows = [{"model": e.label, "params": "", "n": examples_of(e), **row(e)} for e in res.references()]
    for e in res.candidates(res.spec.report_on):
        v = valid[e.candidate]
        rows.append({"model": e.method, "params": e.settings, "n": examples_of(e), "val_avg": round(v.average, 2),
                     "val_avg_se": _r(v.average_stderr), "grid_edge": " ".join(e.grid_edge), **row(e)})
    trials = [{"method": e.method, "params": e.settings, **row(e, "val_"), "within_noise": bool(e.within_noise),
               "within_noise_of_chosen": bool(e.within_noise_method), **{k: e.params[k] for k in e.candidate.given}}
              for e in valid.values() if e.kind == CANDIDATE]
    return pd.DataFrame(rows), pd.DataFrame(trials)


def comparisons(res: SweepResult) -> pd.DataFrame:
    """Every pair of chosen merges on the report split: a − b on the average and per task, with standard errors
    paired per example (evaluation/verdicts.py), and whether the difference exceeds two of them."""
    label = {e.label: e.method for e in res.candidates(res.spec.report_on)}
    return pd.DataFrame([comparison_row(c, label.get(c["a"], c["a"]), label.get(c["b"], c["b"]))
                         for c in res.comparisons])


def comparison_row(c: dict, a: str, b: str) -> dict[str, object]:
    """One row of table1_comparisons.csv from a comparison (evaluation/verdicts.py), its sides named `a` and `b`."""
    rec: dict[str, object] = {"a": a, "b": b, "split": c["split"], "diff": _r(c["diff"]), "stderr": _r(c["stderr"]),
                              "paired": c["paired"], "beyond_noise": c["beyond_noise"]}
    for t, d in c["tasks"].items():
        rec.update({f"{t}_diff": _r(d["diff"]), f"{t}_se": _r(d["stderr"])})
    return rec


def caption(t: pd.DataFrame, model_col: str, agents: list[str], pairs: pd.DataFrame | None = None) -> str:
    """What the mini Table 1 shows, read from its own numbers (test accuracy, %) and their noise
    (analysis/regimes.py: a difference counts only beyond two standard errors, paired where `pairs` has it)."""
    from analysis.regimes import read_table1

    rows = t.set_index(t[model_col].astype(str))
    out = ("Test accuracy (%) ± one standard error; each merge's settings were chosen on the validation split."
           if "avg_se" in rows else "Test accuracy (%); each merge's settings were chosen on the validation split.")
    if "avg" not in rows:
        return out
    return out + " " + read_table1(rows, agents, pairs).text


RESULTS = {"demo:": "results", "demo-shared:": "results-shared"}  # each trio's results folder, next to its models


def evidence_for(base: str, agents: list[str]) -> str:
    """For the overlap reading: one sentence citing the committed Table 1 when `base` and `agents` are exactly a
    demo trio (its base and its three agents, as `demo:NAME` references); "" otherwise or when it is not built."""
    from analysis.regimes import evidence, read_table1
    from merging.reading.refs import demo_prefix, demo_root

    from .evaluate import results_comparisons

    prefix = demo_prefix(base)
    if prefix is None or base != f"{prefix}base" or sorted(agents) != sorted(f"{prefix}{a}" for a in AGENTS):
        return ""
    results = demo_root(prefix).parent / RESULTS[prefix]
    if not (results / "table1.csv").exists():
        return ""
    t = pd.read_csv(results / "table1.csv")
    reading = read_table1(t.set_index(t[t.columns[0]].astype(str)), list(AGENTS), results_comparisons(results))
    return evidence(reading, f"the demo's mini Table 1 of `{prefix}`, test split, settings chosen on validation")


def trio_name(models: Path) -> str:
    """The demo trio a models folder holds, for titles: `demo-shared` for models-shared/, else `demo`."""
    return "demo-shared" if models.name == "models-shared" else "demo"


def save(table: pd.DataFrame, trials: pd.DataFrame, out_dir: Path, trio: str = "demo",
         pairs: pd.DataFrame | None = None, notes: list[str] | None = None, *, name: str = "table1",
         title: str = "Mini Table 1", extra: str = "") -> pd.DataFrame:
    """NAME.csv (columns in order: scores, then their standard errors), NAME.md (`title`: scores ± s.e., the chosen
    settings, the pairwise differences, the sweep's notes, then `extra`), NAME_validation_search.csv and
    NAME_comparisons.csv; returns the table."""
    shown = [*score_columns(table.columns), "avg"]
    table = table.reindex(columns=["model", "params", *shown, *[f"{c}_se" for c in shown], "n", "val_avg",
                                   "val_avg_se", "grid_edge"])
    out_dir.mkdir(parents=True, exist_ok=True)
    trials.to_csv(out_dir / f"{name}_validation_search.csv", index=False)
    table.to_csv(out_dir / f"{name}.csv", index=False)
    if pairs is not None:
        pairs.to_csv(out_dir / f"{name}_comparisons.csv", index=False)
    (out_dir / f"{name}.md").write_text(markdown(table, trio, shown, pairs, notes or [], title) + extra)
    return table


def markdown(table: pd.DataFrame, trio: str, shown: list[str], pairs: pd.DataFrame | None,
             notes: list[str], title: str = "Mini Table 1") -> str:
    """table1.md: the table with `score ± s.e.` cells, the chosen settings, every pairwise difference of the
    chosen merges (paired), and the sweep's notes (coin tosses, grid edges)."""
    def edge(r) -> bool:
        return isinstance(r.grid_edge, str) and bool(r.grid_edge)

    cells = pd.DataFrame({c: [plus_minus(v, se, 2) for v, se in zip(table[c], table[f"{c}_se"])] for c in shown},
                         index=table["model"])
    n = table["n"].dropna().astype(str).unique()
    out = (f"{title} ({trio}, test split, accuracy % ± one standard error; hyper-parameters chosen on "
           f"validation)\n\n" + format_table(cells)
           + f"\n\nStandard errors: binomial √(p(1−p)/n) per task (n = {', '.join(n)} examples per task; 100 per "
             "memory length), √(Σ se²)/3 for the average of the three tasks.\n\nChosen settings:\n"
           + "\n".join(f"- {r.model}: {r.params}" + (f" (on the grid's edge: {r.grid_edge})" if edge(r) else "")
                       for r in table.itertuples() if r.params) + "\n")
    if pairs is not None and len(pairs):
        rows = [f"| {r.a} − {r.b} | {plus_minus(r.diff, r.stderr, 2, signed=True)} | "
                f"{'yes' if r.beyond_noise else 'no'} |" for r in pairs.itertuples()]
        out += ("\nDifferences of the chosen merges (test, average of the three tasks, points; standard error paired "
                "per example; beyond noise = more than two standard errors):\n\n| a − b | difference | beyond noise |\n"
                "|---|---:|---|\n" + "\n".join(rows) + "\n")
    if notes:
        out += "\nThe sweep's notes:\n" + "\n".join(f"- {x}" for x in notes) + "\n"
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m demo.table1", description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=DEMO_DIR / "models")
    parser.add_argument("--out", type=Path, default=DEMO_DIR / "results")
    parser.add_argument("--limit", type=int, default=None, help="examples per task and split (default: all)")
    parser.add_argument("--executor", choices=sorted(EXECUTORS), default="local")
    parser.add_argument("--no-resume", action="store_true", help="score everything again (ignore stored scores)")
    args = parser.parse_args(argv)
    t0 = time.time()
    res = sweep(args.models.resolve(), args.limit, args.executor, ScoreStore(read=not args.no_resume))
    save(*tables(res), args.out.resolve(), trio_name(args.models.resolve()), comparisons(res), res.notes)
    print((args.out.resolve() / "table1.md").read_text())
    print(f"[table1] done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

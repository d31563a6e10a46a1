"""Mini Table 1 with the step rule in RAM / RAM+'s grid (our extension): the search of `table1.py`, with RAM and
RAM+ also tried with ε in representable steps of the stored dtype (`table1_step_rule_grids.yaml`), chosen on the
validation split like every other parameter, the chosen candidates scored on the test split — and RAM / RAM+
under the paper's ε scored on the test split too, so that the two rules are compared on the same examples.

    python -m demo.table1_step_rule [--models assets/demo/models] [--out assets/demo/results] [--limit N]
    python -m demo.table1_step_rule --models assets/demo/models-shared --out assets/demo/results-shared

Writes table1_step_rule.csv / .md, table1_step_rule_comparisons.csv and table1_step_rule_validation_search.csv
next to table1's files (which it leaves as they are), in table1.py's format: scores ± standard errors, paired
differences, the sweep's notes.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from analysis.noise import Z, beyond_noise, compare_text, plus_minus
from evaluation.executors import EXECUTORS
from evaluation.grid import read_grid_file
from evaluation.store import ScoreStore
from evaluation.sweep import Entry, SweepResult, SweepSpec, measure, run_sweep
from evaluation.verdicts import difference

from .evaluate import suite_of_folder
from .evaluator import DemoEvaluator
from .table1 import AGENTS, DEMO_DIR, comparison_row, comparisons, examples_of, row, save, tables, trio_name

GRIDS = DEMO_DIR / "table1_step_rule_grids.yaml"
NAME = "table1_step_rule"
RULED = ("ram", "ram_plus")  # the methods whose region rule the grid varies
PAPER = "{} (paper's ε)"  # the row of a method under the paper's absolute ε, when validation chose another rule


def sweep(models: Path, limit: int | None = None, executor: str = "local",
          store: ScoreStore | None = None) -> SweepResult:
    """Table 1's search with the step rule in RAM / RAM+'s grid, on the demo tasks, validation → test."""
    spec = SweepSpec(str(models / "base"), [str(models / a) for a in AGENTS], read_grid_file(GRIDS),
                     DemoEvaluator(suite=suite_of_folder(models / "base")), limit=limit)
    return run_sweep(spec, EXECUTORS[executor](), store=store)


def paper_rule(res: SweepResult, executor: str = "local", store: ScoreStore | None = None) -> dict[str, Entry]:
    """RAM / RAM+ under the paper's absolute ε (eps_steps 0) on the report split, per method: the chosen entry
    where validation chose that rule, else that candidate scored now (same examples: paired comparisons)."""
    report = {e.candidate: e for e in res.candidates(res.spec.report_on)}
    out, todo = {}, []
    for method in RULED:
        paper = [e.candidate for e in res.candidates(res.spec.select_on)
                 if e.method == method and not e.params.get("eps_steps")]
        if paper and paper[0] in report:
            out[method] = report[paper[0]]
        elif paper:
            todo.append(paper[0])
    if todo:
        out.update({e.method: e for e in measure(res.spec, todo, res.spec.report_on, EXECUTORS[executor](),
                                                   store=store)})
    return out


def _chosen(res: SweepResult) -> dict[str, Entry]:
    return {e.method: e for e in res.candidates(res.spec.report_on) if e.selected}


def with_paper_rows(res: SweepResult, paper: dict[str, Entry], table: pd.DataFrame) -> pd.DataFrame:
    """Table 1's rows plus, after each of RAM / RAM+ when validation chose a step rule, its row under the paper's ε
    (test scores ± s.e.; its validation average too)."""
    valid = {e.candidate: e for e in res.candidates(res.spec.select_on)}
    chosen = _chosen(res)
    rows = table.to_dict("records")
    for method, e in paper.items():
        if chosen.get(method) is e:
            continue
        v = valid[e.candidate]
        at = next(i for i, r in enumerate(rows) if r["model"] == method) + 1
        rows.insert(at, {"model": PAPER.format(method), "params": e.settings, "n": examples_of(e),
                         "val_avg": round(v.average, 2),
                         "val_avg_se": None if v.average_stderr is None else round(v.average_stderr, 2),
                         "grid_edge": "", **row(e)})
    return pd.DataFrame(rows)


def rule_pairs(res: SweepResult, paper: dict[str, Entry]) -> list[tuple[str, str, dict]]:
    """The step rule's own comparisons on the report split (paired per example), where validation chose a step
    rule for RAM / RAM+: the chosen rule vs the paper's ε, and the paper's ε vs task arithmetic (the chosen rule vs
    task arithmetic is among the sweep's comparisons)."""
    chosen, out = _chosen(res), []
    ta = chosen.get("task_arithmetic")
    for method, e in paper.items():
        if chosen.get(method) is e:
            continue  # validation chose the paper's ε: the sweep's comparisons have it
        name = PAPER.format(method)
        if method in chosen:
            out.append((method, name, difference(chosen[method], e)))
        if ta is not None:
            out.append((name, "task_arithmetic", difference(e, ta)))
    for _, _, d in out:
        d.update(split=res.spec.report_on, beyond_noise=beyond_noise(d["diff"], d["stderr"]))
    return out


def extra(trials: pd.DataFrame, chosen: dict[str, str], pairs: list[tuple[str, str, dict]]) -> str:
    """The md's closing sections: every rule RAM / RAM+ tried on validation (± s.e., chosen — `chosen`: method →
    its chosen settings —, within noise of the chosen or not), and what the step rule's comparisons on test allow
    one to say."""
    lines = ["", "The rule: eps_steps = K counts an element as changed when |τ| exceeds K representable steps of "
             "the base's stored dtype at the base weight (our extension); eps_steps = 0 is the paper's |τ| > ε = 1e-5.",
             "", "RAM / RAM+ on validation, every rule tried (average ± s.e.; * chosen, ~ within noise of the chosen):"]
    for r in trials[trials["method"].isin(RULED)].itertuples():
        mark = " *" if chosen.get(r.method) == r.params else (" ~" if r.within_noise_of_chosen else "")
        lines.append(f"- {r.method} {r.params}: {plus_minus(r.val_avg, r.val_avg_se, 2)}{mark}")
    lines += ["", "What the test split allows one to say (paired per example; a difference counts beyond two standard "
              "errors):"]
    lines += [f"- {compare_text(a, b, d['diff'], d['stderr'], 2)}" for a, b, d in pairs]
    return "\n".join(lines) + "\n"


def write(res: SweepResult, paper: dict[str, Entry], out_dir: Path, trio: str) -> pd.DataFrame:
    """The step-rule files, in table1.py's format; returns the table."""
    table, trials = tables(res)
    pairs = rule_pairs(res, paper)
    rows = pd.DataFrame([comparison_row(d, a, b) for a, b, d in pairs])
    every = pd.concat([rows, comparisons(res)], ignore_index=True)
    return save(with_paper_rows(res, paper, table), trials, out_dir, trio, every, res.notes, name=NAME,
                title="Mini Table 1 with the step rule in RAM / RAM+'s grid",
                extra=extra(trials, {m: e.settings for m, e in _chosen(res).items()}, pairs))


SHOWN = {"ram": "RAM", "ram_plus": "RAM+", "task_arithmetic": "task arithmetic"}


def _shown(name: str) -> str:
    """A row's name for readers: `RAM`, `RAM+`, `task arithmetic`, `RAM at the paper's ε`."""
    for method in RULED:
        if name == PAPER.format(method):
            return f"{SHOWN[method]} at the paper's ε"
    return SHOWN.get(name, name)


def _pair(pairs: pd.DataFrame, a: str, b: str) -> tuple[float, float, bool] | None:
    """a − b, its standard error and whether it is beyond noise, from the comparisons file (either order; the
    verdict as computed before rounding), or None."""
    for x, y, sign in ((a, b, 1.0), (b, a, -1.0)):
        got = pairs[(pairs["a"] == x) & (pairs["b"] == y)]
        if len(got) and not pd.isna(got.iloc[0]["stderr"]):
            r = got.iloc[0]
            return sign * float(r["diff"]), float(r["stderr"]), bool(r["beyond_noise"])
    return None


def _judged(a: str, b: str, diff: float, se: float, beyond: bool) -> str:
    """analysis.noise.compare_text's sentence, with the file's verdict (its numbers are rounded to 2 decimals)."""
    if beyond:
        edge = " (at the line of two standard errors, as rounded)" if abs(diff) <= Z * se else ""
        return f"{a} {'beats' if diff > 0 else 'trails'} {b} by {abs(diff):.2f} ± {se:.2f} points{edge}"
    return f"{a} and {b} are within noise ({diff:+.2f} ± {se:.2f} points)"


def reading(results: Path) -> str | None:
    """What the step rule did on one demo trio, from its committed files (NAME.csv and NAME_comparisons.csv): the
    rule validation chose for RAM / RAM+, their test averages ± s.e. next to the paper's ε and task arithmetic,
    and each difference judged by its paired standard error; None when the files are not there."""
    if not (results / f"{NAME}.csv").exists() or not (results / f"{NAME}_comparisons.csv").exists():
        return None
    table = pd.read_csv(results / f"{NAME}.csv").set_index("model")
    pairs = pd.read_csv(results / f"{NAME}_comparisons.csv")
    parts = []
    for method in (m for m in RULED if m in table.index):
        steps = str(table.loc[method, "params"]).split("eps_steps=")[-1]
        paper = PAPER.format(method) if PAPER.format(method) in table.index else method
        score = plus_minus(table.loc[method, "avg"], table.loc[method, "avg_se"], 2)
        text = f"{SHOWN[method]}: validation chose eps_steps = {float(steps):g}, test average {score}"
        if paper != method:
            text += f" (at the paper's ε: {plus_minus(table.loc[paper, 'avg'], table.loc[paper, 'avg_se'], 2)})"
        own = f"{SHOWN[method]} at eps_steps = {float(steps):g}" if paper != method else f"{SHOWN[method]}"
        judged = [(method, paper), (method, "task_arithmetic")] if paper != method else [(method, "task_arithmetic")]
        for a, b in judged:
            got = _pair(pairs, a, b)
            if got is not None:
                text += f"; {_judged(own, _shown(b), *got)}"
        parts.append(text + ".")
    return " ".join(parts) or None


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m demo.table1_step_rule",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=DEMO_DIR / "models")
    parser.add_argument("--out", type=Path, default=DEMO_DIR / "results")
    parser.add_argument("--limit", type=int, default=None, help="examples per task and split (default: all)")
    parser.add_argument("--executor", choices=sorted(EXECUTORS), default="local")
    parser.add_argument("--no-resume", action="store_true", help="score everything again (ignore stored scores)")
    args = parser.parse_args(argv)
    t0 = time.time()
    store = ScoreStore(read=not args.no_resume)
    res = sweep(args.models.resolve(), args.limit, args.executor, store)
    write(res, paper_rule(res, args.executor, store), args.out.resolve(), trio_name(args.models.resolve()))
    print((args.out.resolve() / f"{NAME}.md").read_text())
    print(f"[{NAME}] done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

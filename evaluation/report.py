"""A sweep's results as the JSON document, the tidy table (CSV) and the terminal summary.

JSON: `{"candidates": [{"id", "candidate", "method", "params", "split", "scores", "stderr", "average", "n",
"merge_s", "eval_s", "selected", "best", "within_noise" (validation), "grid_edge" (chosen), …}, …],
"references": […], "comparisons": [{"a", "b", "split", "diff", "stderr", "paired", "tasks"}, …],
"selected": {method: label}, "best": label, "sweep": {…}}`, one candidate entry per candidate per split scored.
`stderr` maps each task and "average" to its standard error in points (analysis/noise.py); `outcomes` holds
the per-example results (a string of 0/1 per task) the paired comparisons were computed from. The CSV holds the
same rows (references too, kind `reference`), one column per parameter and per task, and each task's `… se`.
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from analysis.noise import Z, pack_outcomes
from merging.common.errors import printable

from .sweep import CANDIDATE, Entry, SweepResult


def _num(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def entry_json(e: Entry, select_on: str | None = None) -> dict[str, Any]:
    """One scored entry as JSON (scores and standard errors in %; NaN becomes null); `within_noise` on the
    `select_on` split's candidates, `grid_edge` (parameter names) and `grid_edge_next` on chosen ones."""
    doc: dict[str, Any] = {"id": e.label, "candidate": e.label} if e.kind == CANDIDATE else {"model": e.label}
    if e.kind == CANDIDATE:
        doc.update(method=e.method, params=e.params)
    stderr = {t: _num(e.stderr.get(t)) for t in e.scores} | {"average": _num(e.average_stderr)}
    doc.update(split=e.split, scores=e.scores, stderr=stderr, average=_num(e.average), merge_s=e.merge_s,
               eval_s=e.eval_s)
    if e.fisher_s:
        doc["fisher_s"] = e.fisher_s  # the Fisher pass behind the candidate (all agents' compute, to its N)
    if e.kind == CANDIDATE:
        doc.update(selected=e.selected, best=e.best)
        if e.split == select_on:
            doc["within_noise"] = bool(e.within_noise)
            doc["within_noise_of_chosen"] = bool(e.within_noise_method)
        if e.selected:
            doc.update(grid_edge=list(e.grid_edge), grid_edge_next=e.grid_edge)
    doc.update(detail=e.detail, detail_stderr=e.detail_stderr, n=e.n, resumed=e.resumed,
               outcomes=pack_outcomes(e.outcomes))
    if e.lambdas is not None:
        doc["lambdas"] = e.lambdas
    if e.error is not None:
        doc["error"] = e.error
    return doc


def result_json(res: SweepResult, executor: str) -> dict[str, Any]:
    """The whole sweep as one JSON document."""
    spec, ctx = res.spec, res.context
    return {
        "candidates": [entry_json(e, spec.select_on) for e in res.candidates()],
        "references": [entry_json(e) for e in res.references()],
        "comparisons": [{**c, "diff": _num(c["diff"]), "stderr": _num(c["stderr"])} for c in res.comparisons],
        "selected": {m: c.label for m, c in res.selected.items()},
        "best": res.best.label if res.best is not None else None,
        "sweep": {"base": spec.base, "agents": list(spec.agents), "labels": ctx["labels"],
                  "grids": [g.text for g in spec.grids], "evaluator": spec.evaluator.name,
                  "evaluator_fingerprint": ctx["key"]["evaluator_fingerprint"], "tasks": list(spec.evaluator.tasks),
                  "select_on": spec.select_on, "report_on": spec.report_on, "limit": spec.limit,
                  "executor": executor, "inputs": ctx["inputs"], "device": ctx["device"],
                  "input_fingerprints": ctx["fingerprints"], "seconds": res.seconds, "notes": res.notes},
    }


def result_frame(res: SweepResult) -> pd.DataFrame:
    """The tidy table: one row per entry; kind, candidate, method, split, one column per parameter, one per
    task score (and detail), average, seconds, selected, best."""
    params = list(dict.fromkeys(k for e in res.entries for k in e.params))
    tasks = list(dict.fromkeys(k for e in res.entries for k in e.scores))
    detail = list(dict.fromkeys(k for e in res.entries for k in e.detail))
    rows = []
    for e in res.entries:
        row: dict[str, Any] = {"kind": e.kind, "candidate": e.label, "method": e.method, "settings": e.settings,
                               "split": e.split}
        row.update({p: e.params.get(p) for p in params})
        row.update({t: e.scores.get(t) for t in tasks})
        row.update({f"{t} se": e.stderr.get(t) for t in tasks})
        row.update({d: e.detail.get(d) for d in detail})
        row.update(average=_num(e.average), average_se=_num(e.average_stderr), merge_s=e.merge_s,
                   fisher_s=e.fisher_s, eval_s=e.eval_s, selected=e.selected, best=e.best,
                   within_noise=e.within_noise, grid_edge=" ".join(e.grid_edge), error=e.error or "")
        rows.append(row)
    fisher = ["fisher_s"] if any(e.fisher_s for e in res.entries) else []
    cols = ["kind", "candidate", "method", "settings", "split", *params, *tasks, *[f"{t} se" for t in tasks],
            *detail, "average", "average_se", "merge_s", *fisher, "eval_s", "selected", "best", "within_noise",
            "grid_edge", "error"]
    return pd.DataFrame(rows, columns=cols)


def csv_cell(value: Any) -> Any:
    """A cell that a spreadsheet shows as text, never runs: text starting with = + - @ (or a tab/CR) is
    prefixed with an apostrophe; numbers stay numbers."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """The table as CSV, every text cell escaped against formula injection."""
    return frame.map(csv_cell).to_csv(index=False).encode()


def summary_lines(res: SweepResult) -> list[str]:
    """What the terminal shows at the end: the selection table, the choices, the report table."""
    tasks = list(dict.fromkeys(k for e in res.entries for k in e.scores))
    width = max([len(printable(e.label, 60)) for e in res.entries] + [9])
    cols = {t: max(6, len(printable(t, 24))) for t in tasks}

    def line(e: Entry) -> str:
        mark = "*" if e.best else ("+" if e.selected else ("~" if e.within_noise else " "))
        if e.error:
            return f"{mark} {printable(e.label, 60):{width}s}  failed: {printable(e.error, 160)}"
        cells = "  ".join(_pm(e.scores.get(t, float("nan")), e.stderr.get(t), cols[t]) for t in tasks)
        return (f"{mark} {printable(e.label, 60):{width}s}  {cells}  {_pm(e.average, e.average_stderr, 6)}  "
                f"{e.merge_s:6.2f} s  {e.eval_s:6.2f} s{'  (stored)' if e.resumed else ''}")

    head = f"  {'':{width}s}  " + "  ".join(f"{printable(t, 24):>{cols[t] + 7}s}" for t in tasks) + \
        "            avg   merge     eval"
    out = []
    for split in dict.fromkeys(e.split for e in res.entries):
        rows = [e for e in res.entries if e.split == split]
        out += ["", f"{split} split ({len(rows)} scored; accuracy % ± standard error; + chosen for its method, "
                    f"* best overall, ~ within noise of the best):", head]
        out += [line(e) for e in rows]
    if res.best is not None:
        out += ["", f"best overall (by {res.spec.select_on} average): {printable(res.best.label, 120)}"]
    out += comparison_lines(res)
    out += [f"note: {printable(n, 240)}" for n in res.notes]
    return out


def _pm(value: float, se: float | None, width: int) -> str:
    """`30.67 ±2.66` in a fixed width (`±  –` when the standard error is unknown)."""
    err = "  –  " if se is None or not math.isfinite(se) else f"{se:5.2f}"
    return f"{value:{width}.2f} ±{err}"


def comparison_lines(res: SweepResult) -> list[str]:
    """The chosen candidates pair by pair on the report split: difference of averages ± its standard error, and
    whether it exceeds Z standard errors."""
    if not res.comparisons:
        return []
    out = ["", f"{res.spec.report_on} split, chosen against chosen (difference of averages ± standard error, "
               f"paired per example; a difference counts beyond {Z:g} standard errors):"]
    for c in res.comparisons:
        se = "–" if c["stderr"] is None else f"{c['stderr']:.2f}"
        verdict = ("beyond noise" if c["beyond_noise"] else "within noise") + ("" if c["paired"] else " (unpaired)")
        out.append(f"  {printable(c['a'], 50)} − {printable(c['b'], 50)}: {c['diff']:+.2f} ± {se}  {verdict}")
    return out


def score_table(res: SweepResult) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The report split as a Table 1 (rows: the base, the agents and each method's chosen candidate by method
    name; columns: each task, `avg`, and their `<column>_se`) and its paired comparisons (a, b by method, diff,
    stderr, `<task>_diff`, `<task>_se`): what analysis.regimes reads."""
    rows = {}
    report = [e for e in res.entries if e.split == res.spec.report_on and e.ok]
    for e in report:
        name = e.method if e.kind == CANDIDATE else e.label
        rows[name] = {**e.scores, "avg": e.average, **{f"{t}_se": e.stderr.get(t) for t in e.scores},
                      "avg_se": e.average_stderr}
    method = {e.label: e.method for e in report if e.kind == CANDIDATE}
    pairs = [{"a": method.get(c["a"], c["a"]), "b": method.get(c["b"], c["b"]), "diff": c["diff"],
              "stderr": c["stderr"], **{f"{t}_{k}": d["diff" if k == "diff" else "stderr"]
                                         for t, d in c["tasks"].items() for k in ("diff", "se")}}
             for c in res.comparisons if c["paired"]]
    return pd.DataFrame(rows).T, pd.DataFrame(pairs, columns=["a", "b", "diff", "stderr"] if not pairs else None)

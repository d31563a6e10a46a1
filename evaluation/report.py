"""A sweep's results as the JSON document, the tidy table (CSV) and the terminal summary.

JSON: `{"candidates": [{"candidate", "method", "params", "split", "scores", "average", "merge_s", "eval_s",
"selected", "best", …}, …], "references": […], "selected": {method: label}, "best": label, "sweep": {…}}`,
one candidate entry per candidate per split scored. The CSV holds the same rows (references too, kind
`reference`), one column per parameter and per task.
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from merging.common.errors import printable

from .sweep import CANDIDATE, Entry, SweepResult


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def entry_json(e: Entry) -> dict[str, Any]:
    """One scored entry as JSON (scores in %; NaN becomes null)."""
    doc: dict[str, Any] = {"candidate": e.label} if e.kind == CANDIDATE else {"model": e.label}
    if e.kind == CANDIDATE:
        doc.update(method=e.method, params=e.params)
    doc.update(split=e.split, scores=e.scores, average=_num(e.average), merge_s=e.merge_s, eval_s=e.eval_s)
    if e.fisher_s:
        doc["fisher_s"] = e.fisher_s  # the Fisher pass behind the candidate (all agents' compute, to its N)
    if e.kind == CANDIDATE:
        doc.update(selected=e.selected, best=e.best)
    doc.update(detail=e.detail, n=e.n, resumed=e.resumed)
    if e.lambdas is not None:
        doc["lambdas"] = e.lambdas
    if e.error is not None:
        doc["error"] = e.error
    return doc


def result_json(res: SweepResult, executor: str) -> dict[str, Any]:
    """The whole sweep as one JSON document."""
    spec, ctx = res.spec, res.context
    return {
        "candidates": [entry_json(e) for e in res.candidates()],
        "references": [entry_json(e) for e in res.references()],
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
        row.update({d: e.detail.get(d) for d in detail})
        row.update(average=_num(e.average), merge_s=e.merge_s, fisher_s=e.fisher_s, eval_s=e.eval_s,
                   selected=e.selected, best=e.best, error=e.error or "")
        rows.append(row)
    fisher = ["fisher_s"] if any(e.fisher_s for e in res.entries) else []
    cols = ["kind", "candidate", "method", "settings", "split", *params, *tasks, *detail, "average", "merge_s",
            *fisher, "eval_s", "selected", "best", "error"]
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
        mark = "*" if e.best else ("+" if e.selected else " ")
        if e.error:
            return f"{mark} {printable(e.label, 60):{width}s}  failed: {printable(e.error, 160)}"
        cells = "  ".join(f"{e.scores.get(t, float('nan')):{cols[t]}.2f}" for t in tasks)
        return (f"{mark} {printable(e.label, 60):{width}s}  {cells}  {e.average:6.2f}  "
                f"{e.merge_s:6.2f} s  {e.eval_s:6.2f} s{'  (stored)' if e.resumed else ''}")

    head = f"  {'':{width}s}  " + "  ".join(f"{printable(t, 24):>{cols[t]}s}" for t in tasks) + \
        "     avg   merge     eval"
    out = []
    for split in dict.fromkeys(e.split for e in res.entries):
        rows = [e for e in res.entries if e.split == split]
        out += ["", f"{split} split ({len(rows)} scored; + chosen for its method, * best overall):", head]
        out += [line(e) for e in rows]
    if res.best is not None:
        out += ["", f"best overall (by {res.spec.select_on} average): {printable(res.best.label, 120)}"]
    out += [f"note: {printable(n, 200)}" for n in res.notes]
    return out

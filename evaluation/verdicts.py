"""What a finished sweep may claim: which candidates its validation data cannot tell from the best (paired
per example, analysis/noise.py), when a choice is a coin toss, how the chosen candidates differ on the report
split (every pair, with the paired standard error), and which chosen values sit on the edge of what was tried
(with the next values to try).

Works on the sweep's entries (evaluation/sweep.py's `Entry`: scores, stderr, outcomes, average, candidate) —
nothing here scores or selects; selection stays by validation average alone (evaluation/sweep.py).
"""
from __future__ import annotations

import math
from typing import Any, Iterable

from analysis.noise import Z, beyond_noise, paired, unpaired_se
from merging.common.errors import RamStudioError
from merging.methods import get_method

EDGE_STEPS = 2  # how many values past an edge to suggest


def difference(a, b) -> dict[str, Any]:
    """a − b on the task average (points) with its standard error: paired per example when both entries kept
    outcomes for the same examples (`paired` True), else √(se_a² + se_b²) (`paired` False), else None; per task
    too."""
    tasks = [t for t in a.scores if t in b.scores]
    diff = sum(a.scores[t] - b.scores[t] for t in tasks) / len(tasks) if tasks else float("nan")
    got = paired(a.outcomes, b.outcomes, tasks) if tasks else None
    if got is not None:
        d, se, per = got
        return {"diff": d, "stderr": se, "paired": True,
                "tasks": {t: {"diff": x, "stderr": s} for t, (x, s) in per.items()}}
    per_task = {t: {"diff": a.scores[t] - b.scores[t], "stderr": unpaired_se(a.stderr.get(t), b.stderr.get(t))}
                for t in tasks}
    return {"diff": diff, "stderr": unpaired_se(a.average_stderr, b.average_stderr), "paired": False,
            "tasks": per_task}


def within_noise(entry, best) -> bool:
    """Whether `best` − `entry` on the average is at most Z standard errors (an unknown s.e.: only an exact tie)."""
    if not entry.ok or best is None or not best.ok:
        return False
    if entry is best:
        return True
    d = difference(best, entry)
    return d["diff"] <= 0 or (d["stderr"] is not None and not beyond_noise(d["diff"], d["stderr"]))


def mark_within_noise(valid: list, chosen: dict[str, Any], best) -> list[str]:
    """Set each validation entry's `within_noise` (of the best overall) and `within_noise_method` (of its method's
    chosen candidate); returns the notes that say where a choice is a coin toss."""
    by_cand = {e.candidate: e for e in valid}
    best_e = by_cand.get(best)
    for e in valid:
        e.within_noise = within_noise(e, best_e)
        own = by_cand.get(chosen.get(e.method))
        e.within_noise_method = within_noise(e, own)
    notes = []
    for method, c in chosen.items():
        ce = by_cand.get(c)
        mine = [e for e in valid if e.method == method and e.ok]
        tied = [e for e in mine if e is not ce and e.within_noise_method]
        if ce is not None and tied:
            others = len(mine) - 1
            what = ("the other setting is" if others == 1 else
                    f"{len(tied)} of the other {others} settings {'is' if len(tied) == 1 else 'are'}")
            notes.append(f"{method}: {what} within noise of the chosen {ce.candidate.settings or ce.label} on "
                         f"validation (paired difference under {Z:g} standard errors): the choice among them is a "
                         "coin toss")
    if best_e is not None:
        rivals = [by_cand[c] for m, c in chosen.items() if c != best and c in by_cand and by_cand[c].within_noise]
        if rivals:
            notes.append(f"best overall: {best_e.label} is within noise of {', '.join(e.label for e in rivals)} on "
                         "validation: which of these methods is best is a coin toss on this data")
    return notes


def comparisons(report: list, split: str) -> list[dict[str, Any]]:
    """Every pair (a before b, in the order given) of the chosen candidates' report-split entries: a − b on the
    average with its standard error (paired per example where outcomes were kept), and per task."""
    out = []
    for i, a in enumerate(report):
        for b in report[i + 1:]:
            if not (a.ok and b.ok):
                continue
            d = difference(a, b)
            out.append({"a": a.label, "b": b.label, "split": split, **d,
                        "beyond_noise": beyond_noise(d["diff"], d["stderr"])})
    return out


# ---------------------------------------------------------------- grid edges

def _round(v: float) -> float:
    """Two significant figures: a suggestion to type, not a computed optimum."""
    return float(f"{v:.2g}")


def _allowed(method: str, name: str, value: float) -> bool:
    decl = next(p for p in get_method(method).params if p.name == name)
    try:
        decl.resolve(value)
    except RamStudioError:
        return False
    return True


def _bound(method: str, name: str, high: bool) -> float | None:
    decl = next(p for p in get_method(method).params if p.name == name)
    return decl.high if high else decl.low


def _spread(vs: list[float]) -> float:
    """How unevenly `vs` are spaced: the coefficient of variation of their steps (0 for an even grid)."""
    steps = [b - a for a, b in zip(vs, vs[1:])]
    mean = sum(steps) / len(steps)
    return math.sqrt(sum((d - mean) ** 2 for d in steps) / len(steps)) / mean if mean else 0.0


def next_values(method: str, name: str, values: list[float], high: bool) -> list[float]:
    """Up to EDGE_STEPS values past the edge of `values` (high or low end): the grid's own spacing continued
    (geometric when the values are more evenly spaced on a log scale and span a factor of 10 or more, else the
    mean step rounded to one significant figure); where that leaves the parameter's allowed range, halfway to
    its bound instead; [] when nothing lies beyond."""
    vs = sorted(values)
    edge = vs[-1] if high else vs[0]
    geometric = vs[0] > 0 and _spread([math.log(v) for v in vs]) < _spread(vs) and vs[-1] / vs[0] >= 10
    if geometric:
        ratio = (vs[-1] / vs[0]) ** (1 / (len(vs) - 1))
        steps = [edge * ratio ** k if high else edge / ratio ** k for k in range(1, EDGE_STEPS + 1)]
    else:
        step = (vs[-1] - vs[0]) / (len(vs) - 1)
        step = float(f"{step:.1g}") or step
        steps = [edge + k * step if high else edge - k * step for k in range(1, EDGE_STEPS + 1)]
    beyond = [_round(v) for v in steps if (_round(v) > edge if high else _round(v) < edge)]
    out = [v for v in dict.fromkeys(beyond) if _allowed(method, name, v)]
    if not out:
        bound = _bound(method, name, high)
        if bound is not None and math.isfinite(bound):
            mid = _round((edge + bound) / 2)
            if (mid > edge if high else mid < edge) and _allowed(method, name, mid):
                out = [mid]
    return out


def grid_edges(chosen, tried: Iterable) -> dict[str, list[float]]:
    """For a chosen candidate: each float parameter its grid searched (two values or more, among the method's
    `tried` candidates) whose chosen value is the smallest or largest tried → the next values to try."""
    tried = [c for c in tried if c.method == chosen.method]
    decls = {p.name: p for p in get_method(chosen.method).params}
    out: dict[str, list[float]] = {}
    params = chosen.param_dict
    for name in chosen.given:
        decl = decls.get(name)
        if decl is None or decl.kind is not float or decl.choices:
            continue
        values = sorted({float(c.param_dict[name]) for c in tried if isinstance(c.param_dict.get(name), (int, float))})
        if len(values) < 2 or params[name] not in (values[0], values[-1]):
            continue
        suggestion = next_values(chosen.method, name, values, high=params[name] == values[-1])
        if suggestion:
            out[name] = suggestion
    return out


def edge_note(entry, edges: dict[str, list[float]]) -> str:
    """One line: which chosen values sit on the edge of what was tried, and what to try next."""
    parts = []
    for name, nxt in edges.items():
        v = entry.params[name]
        side = "largest" if nxt[0] > v else "smallest"
        parts.append(f"{name}={v:g} is the {side} value tried (try {name}={','.join(f'{x:g}' for x in nxt)})")
    return f"{entry.method}: the chosen {'; '.join(parts)} — the best setting may lie beyond the grid"


def judge(entries: list, select_on: str, report_on: str, chosen: dict[str, Any], best,
          notes: list[str]) -> list[dict[str, Any]]:
    """After selection: mark within-noise validation entries and chosen candidates' grid edges (on their entries
    of both splits), add the coin-toss and grid-edge notes to `notes`, and return the report-split comparisons."""
    valid = [e for e in entries if e.kind == "candidate" and e.split == select_on]
    notes += mark_within_noise(valid, chosen, best)
    tried = [e.candidate for e in valid]
    for c in chosen.values():
        edges = grid_edges(c, tried)
        mine = [e for e in entries if e.candidate == c]
        for e in mine:
            e.grid_edge = edges
        if edges and mine:
            notes.append(edge_note(mine[0], edges))
    report = [e for e in entries if e.kind == "candidate" and e.split == report_on and e.selected]
    return comparisons(report, report_on)

"""When does RAM help? A plain-language reading of a mini Table 1 (accuracy % per model and task), next to the
shared-region diagnostics' regime, computed from the numbers so that it can never contradict the table — and
never claims more than the table's noise allows: a difference counts only beyond two standard errors (paired per
example when the table's comparisons file has the pair, else from the two scores' own standard errors)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from .noise import beyond_noise, compare_text, plus_minus, unpaired_se

RAM_METHODS = ("ram", "ram_plus")
BASELINES = ("task_arithmetic", "average")
LABELS = {"ram": "RAM", "ram_plus": "RAM+", "task_arithmetic": "task arithmetic", "average": "averaging",
          "ties": "TIES", "dare_ta": "DARE+TA", "dare_ties": "DARE+TIES", "fisher": "Fisher merging"}


@dataclass
class TableReading:
    """The facts a Table 1 gives about RAM: averages, the best merge, RAM minus each baseline (with its standard
    error: None when the table has none), and one paragraph."""

    best: str | None  # the merge with the highest average (None: no merge rows)
    ram_minus: dict[str, float]  # baseline → best RAM variant's average minus the baseline's
    retention: dict[str, float]  # agent → best RAM variant's own-task score minus the agent's
    text: str
    ram_minus_se: dict[str, float | None] = field(default_factory=dict)
    ram: str | None = None  # the RAM variant the comparisons are about
    tied_with_best: list[str] = field(default_factory=list)  # merges within noise of the best
    ram_minus_tasks: dict[str, dict[str, tuple[float, float | None]]] = field(default_factory=dict)  # per task


def _label(name: str) -> str:
    return LABELS.get(name, name)


def _cell(table: pd.DataFrame, row: str, col: str) -> float | None:
    v = table.loc[row, col] if col in table.columns else None
    return None if v is None or pd.isna(v) else float(v)


def difference(table: pd.DataFrame, pairs: pd.DataFrame | None, a: str, b: str,
               col: str = "avg") -> tuple[float, float | None, bool]:
    """a − b on `col` with its standard error: paired (from `pairs`, the table's comparisons: columns a, b, diff,
    stderr and `<task>_diff`/`<task>_se`) when it has the pair, else √(se_a² + se_b²) from the table's `<col>_se`
    columns, else None; and whether it was paired."""
    diff = float(table.loc[a, col]) - float(table.loc[b, col])
    if pairs is not None and len(pairs):
        dcol, scol = ("diff", "stderr") if col == "avg" else (f"{col}_diff", f"{col}_se")
        for sign, (x, y) in ((1.0, (a, b)), (-1.0, (b, a))):
            hit = pairs[(pairs["a"].astype(str) == x) & (pairs["b"].astype(str) == y)]
            if len(hit) and scol in hit.columns and pd.notna(hit.iloc[0][scol]):
                return sign * float(hit.iloc[0][dcol]), float(hit.iloc[0][scol]), True
    return diff, unpaired_se(_cell(table, a, f"{col}_se"), _cell(table, b, f"{col}_se")), False


def score(table: pd.DataFrame, row: str, col: str = "avg") -> str:
    """`33.2 ± 1.4` (the value alone when the table has no standard error)."""
    return plus_minus(float(table.loc[row, col]), _cell(table, row, f"{col}_se"))


def versus(table: pd.DataFrame, pairs: pd.DataFrame | None, a: str, b: str, col: str = "avg") -> str:
    """`RAM (33.2 ± 1.4) trails task arithmetic (34.9 ± 1.5) by 1.7 ± 0.9 points (paired)`, or within noise."""
    diff, se, was_paired = difference(table, pairs, a, b, col)
    how = "" if se is None else (" (paired per example)" if was_paired else " (unpaired)")
    return compare_text(f"{_label(a)} ({score(table, a, col)})", f"{_label(b)} ({score(table, b, col)})",
                        diff, se) + how


def read_table1(table: pd.DataFrame, agents: list[str], pairs: pd.DataFrame | None = None) -> TableReading:
    """Read a Table 1 indexed by model (base, agents, merges) with one column per task and `avg` (and, where
    measured, `<column>_se`); `pairs`: its paired comparisons (table1_comparisons.csv)."""
    if "avg" not in table.columns:
        return TableReading(None, {}, {}, "The table has no average column to compare merges on.")
    rows = table.index.astype(str)
    merges = [m for m in rows if m != "base" and m not in agents and math.isfinite(float(table.loc[m, "avg"]))]
    if not merges:
        return TableReading(None, {}, {}, "Only the base and the agents are scored so far: no merge to compare.")
    best = max(merges, key=lambda m: float(table.loc[m, "avg"]))
    tied = []
    for m in merges:
        d, se, _ = difference(table, pairs, best, m)
        if m != best and se is not None and not beyond_noise(d, se):
            tied.append(m)
    parts = [f"Best merge on average: {_label(best)} ({score(table, best)})"
             + (f", within noise of {', '.join(f'{_label(m)} ({score(table, m)})' for m in tied)}" if tied else "")
             + "."]
    if "avg_se" not in table.columns and pairs is None:
        parts.append("The table has no standard errors, so no difference between merges is judged.")
    ram_minus: dict[str, float] = {}
    ram_minus_se: dict[str, float | None] = {}
    ram_minus_tasks: dict[str, dict[str, tuple[float, float | None]]] = {}
    retention: dict[str, float] = {}
    rams = [m for m in RAM_METHODS if m in merges]
    top = max(rams, key=lambda m: float(table.loc[m, "avg"])) if rams else None
    if top is not None:
        tasks = [a for a in agents if a in table.columns]
        for b in BASELINES:
            if b in merges:
                ram_minus[b], ram_minus_se[b], _ = difference(table, pairs, top, b)
                ram_minus_tasks[b] = {t: difference(table, pairs, top, b, t)[:2] for t in tasks}
        if ram_minus:
            parts.append("; ".join(versus(table, pairs, top, b) for b in ram_minus) + ".")
        own = [a for a in agents if a in rows and a in table.columns]
        for a in own:
            retention[a] = float(table.loc[top, a]) - float(table.loc[a, a])
        if retention:
            parts.append(f"On each agent's own task {_label(top)} keeps " + ", ".join(
                f"{a} {score(table, top, a)} of {score(table, a, a)}" for a in own) + ".")
    else:
        parts.append("RAM is not in this table.")
    return TableReading(best, ram_minus, retention, " ".join(parts), ram_minus_se, top, tied, ram_minus_tasks)


def evidence(reading: TableReading, source: str) -> str:
    """One sentence citing a Table 1 (or a sweep) of the same models for the overlap reading: where RAM stands
    against task arithmetic, judged against the noise."""
    if reading.ram is None or "task_arithmetic" not in reading.ram_minus:
        return ""
    d, se = reading.ram_minus["task_arithmetic"], reading.ram_minus_se.get("task_arithmetic")
    if se is None:
        verdict = f"{_label(reading.ram)} − task arithmetic = {d:+.1f} points, without a standard error to judge it"
    elif beyond_noise(d, se):
        verdict = (f"{_label(reading.ram)} {'beats' if d > 0 else 'trails'} task arithmetic by {abs(d):.1f} ± "
                   f"{se:.1f} points, beyond noise")
    else:
        verdict = (f"{_label(reading.ram)} and task arithmetic are within noise of each other ({d:+.1f} ± "
                   f"{se:.1f} points)")
    tasks = [f"{'ahead' if d > 0 else 'behind'} on {t} ({d:+.1f} ± {e:.1f})"
             for t, (d, e) in reading.ram_minus_tasks.get("task_arithmetic", {}).items() if beyond_noise(d, e)]
    if tasks:
        verdict += f"; per task, {_label(reading.ram)} is " + ", ".join(tasks) + " beyond noise"
    return f"Measured on these models ({source}): {verdict}."


def _standing(d: float, se: float | None) -> str:
    if se is None:
        return "not judged against"
    return ("ahead of" if d > 0 else "behind") if beyond_noise(d, se) else "within noise of"


def contrast(readings: dict[str, tuple[str, TableReading]]) -> str:
    """One sentence across trios (name → (diagnostics regime, table reading)): does RAM's standing against task
    arithmetic follow the regime of the shared region? A standing is ahead / behind only beyond two standard
    errors, else within noise."""
    known = {n: (reg, r.ram_minus["task_arithmetic"], r.ram_minus_se.get("task_arithmetic"))
             for n, (reg, r) in readings.items() if "task_arithmetic" in r.ram_minus}
    if len(known) < 2:
        return ""
    verdict = {n: _standing(d, se) for n, (_, d, se) in known.items()}
    each = "; ".join(f"{n} (shared region: {reg}) RAM is {verdict[n]} task arithmetic "
                     f"({plus_minus(d, se, signed=True)} points)" for n, (reg, d, se) in known.items())
    regimes = {reg for reg, _, _ in known.values()}
    if len(set(verdict.values())) == 1:
        same = verdict[next(iter(verdict))]
        gaps = sorted(known, key=lambda n: abs(known[n][1]))
        narrow = ""
        lo, hi = known[gaps[0]], known[gaps[-1]]
        gap_se = unpaired_se(lo[2], hi[2])
        if beyond_noise(abs(hi[1]) - abs(lo[1]), gap_se):
            narrow = f" The gap is smaller on {gaps[0]} ({abs(lo[1]):.1f} against {abs(hi[1]):.1f} points)."
        return (f"On {each}: the same standing in every trio ({same} task arithmetic), so on these demos the regime "
                "of the shared region alone does not decide whether RAM beats task arithmetic." + narrow)
    if len(regimes) == 1:
        return f"On {each}: the standing changes between trios whose shared regions read the same."
    shared = [(d, se) for reg, d, se in known.values() if reg == "shared"]
    other = [(d, se) for reg, d, se in known.values() if reg != "shared"]
    if len(shared) == 1 and len(other) == 1:
        delta, se = shared[0][0] - other[0][0], unpaired_se(shared[0][1], other[0][1])
        if not beyond_noise(delta, se):
            return (f"On {each}: the two standings differ by less than their noise "
                    f"({plus_minus(delta, se, signed=True)} points).")
        why = ("RAM does better where the shared updates agree, as the paper's premise predicts" if delta > 0 else
               "RAM does worse where the shared updates agree, the opposite of what the paper's premise predicts")
        return f"On {each}: {why} ({plus_minus(delta, se, signed=True)} points between the trios)."
    return f"On {each}: RAM's standing against task arithmetic changes with the trio."

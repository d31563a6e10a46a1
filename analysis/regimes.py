"""When does RAM help? A plain-language reading of a mini Table 1 (accuracy % per model and task), next to the
shared-region diagnostics' regime, computed from the numbers so that it can never contradict the table."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

TIE = 0.5  # points: differences of averages smaller than this are read as a tie
RAM_METHODS = ("ram", "ram_plus")
BASELINES = ("task_arithmetic", "average")
LABELS = {"ram": "RAM", "ram_plus": "RAM+", "task_arithmetic": "task arithmetic", "average": "averaging",
          "ties": "TIES", "dare_ta": "DARE+TA", "dare_ties": "DARE+TIES"}


@dataclass
class TableReading:
    """The facts a Table 1 gives about RAM: averages, the best merge, RAM minus each baseline, and one paragraph."""

    best: str | None  # the merge with the highest average (None: no merge rows)
    ram_minus: dict[str, float]  # baseline → best RAM variant's average minus the baseline's
    retention: dict[str, float]  # agent → best RAM variant's own-task score minus the agent's
    text: str


def _label(name: str) -> str:
    return LABELS.get(name, name)


def _compare(diff: float, a: str, b: str) -> str:
    if abs(diff) < TIE:
        return f"{a} ties with {b} ({diff:+.1f} points)"
    return f"{a} {'beats' if diff > 0 else 'trails'} {b} by {abs(diff):.1f} points"


def read_table1(table: pd.DataFrame, agents: list[str]) -> TableReading:
    """Read a Table 1 indexed by model (base, agents, merges) with one column per task and `avg`."""
    if "avg" not in table.columns:
        return TableReading(None, {}, {}, "The table has no average column to compare merges on.")
    rows = table.index.astype(str)
    merges = [m for m in rows if m != "base" and m not in agents and math.isfinite(float(table.loc[m, "avg"]))]
    if not merges:
        return TableReading(None, {}, {}, "Only the base and the agents are scored so far: no merge to compare.")
    best = max(merges, key=lambda m: float(table.loc[m, "avg"]))
    rams = [m for m in RAM_METHODS if m in merges]
    parts = [f"Best merge on average: {_label(best)} ({float(table.loc[best, 'avg']):.1f})."]
    ram_minus: dict[str, float] = {}
    retention: dict[str, float] = {}
    if rams:
        top = max(rams, key=lambda m: float(table.loc[m, "avg"]))
        avg = float(table.loc[top, "avg"])
        for b in BASELINES:
            if b in merges:
                ram_minus[b] = avg - float(table.loc[b, "avg"])
        if ram_minus:
            parts.append(f"{_label(top)} ({avg:.1f}): " + "; ".join(
                _compare(d, _label(top), f"{_label(b)} ({float(table.loc[b, 'avg']):.1f})")
                for b, d in ram_minus.items()) + ".")
        own = [a for a in agents if a in rows and a in table.columns]
        for a in own:
            retention[a] = float(table.loc[top, a]) - float(table.loc[a, a])
        if retention:
            parts.append(f"On each agent's own task {_label(top)} keeps " + ", ".join(
                f"{a} {float(table.loc[top, a]):.1f} of {float(table.loc[a, a]):.1f}" for a in own) + ".")
    else:
        parts.append("RAM is not in this table.")
    return TableReading(best, ram_minus, retention, " ".join(parts))


def contrast(readings: dict[str, tuple[str, TableReading]]) -> str:
    """One sentence across trios (name → (diagnostics regime, table reading)): does RAM's standing against task
    arithmetic follow the regime of the shared region?"""
    known = {n: (reg, r.ram_minus["task_arithmetic"]) for n, (reg, r) in readings.items()
             if "task_arithmetic" in r.ram_minus}
    if len(known) < 2:
        return ""
    verdict = {n: ("ahead of" if d >= TIE else "behind" if d <= -TIE else "level with") for n, (_, d) in known.items()}
    each = "; ".join(f"{n} (shared region: {reg}) RAM is {verdict[n]} task arithmetic ({d:+.1f} points)"
                     for n, (reg, d) in known.items())
    regimes = {reg for reg, _ in known.values()}
    if len(set(verdict.values())) == 1:
        gaps = sorted(known, key=lambda n: abs(known[n][1]))
        narrow = (f" The gap is smallest on {gaps[0]} ({abs(known[gaps[0]][1]):.1f} against "
                  f"{abs(known[gaps[-1]][1]):.1f} points)." if abs(known[gaps[-1]][1]) - abs(known[gaps[0]][1]) >= TIE
                  else "")
        return (f"On {each}: the same standing in every trio, so on these demos the regime of the shared region "
                "alone does not decide whether RAM beats task arithmetic; the agents' own gains and where their "
                "updates sit matter as much." + narrow)
    if len(regimes) == 1:
        return f"On {each}: the standing changes between trios whose shared regions read the same."
    shared = [d for reg, d in known.values() if reg == "shared"]
    other = [d for reg, d in known.values() if reg != "shared"]
    if shared and other and min(shared) > max(other):
        why = "RAM does better where the shared updates agree, as the paper's premise predicts"
    elif shared and other and max(shared) < min(other):
        why = "RAM does worse where the shared updates agree, the opposite of what the paper's premise predicts"
    else:
        why = "RAM's standing changes between the trios"
    return f"On {each}: {why}."

"""How a sweep chooses (the paper's protocol): each method's best candidate by its selection-split average alone
(ties to the first in sweep order), the best of the chosen, and the order its entries are shown in."""
from __future__ import annotations

from .grid import Candidate
from .sweep_records import CANDIDATE, Entry, SweepSpec


def select(method: str, entries: list[Entry], split: str) -> Candidate | None:
    """The best candidate of `method` by average score on `split`, ties going to the first in sweep order.

    Called with the selection split's entries only; refuses anything else, so a report-split score can
    never decide a choice."""
    if any(e.split != split for e in entries):
        raise AssertionError("selection was handed scores of another split")
    best: Entry | None = None
    for e in entries:
        if e.kind == CANDIDATE and e.method == method and e.ok and (best is None or e.average > best.average):
            best = e
    return None if best is None else best.candidate


def grid_order(spec: SweepSpec) -> list[str]:
    """The methods in the order of the grids (ties and listings follow it)."""
    return [g.method for g in spec.grids]


def select_finished(finished: set[str], spec: SweepSpec, entries: list[Entry],
                    seen: dict[Candidate, tuple[int, int]], selected: dict[str, Candidate], notes: list[str]) -> None:
    """Choose each method no later stage extends, on the selection split (a note when none could be scored)."""
    # in the sweep's order, whatever order the executor returned them in: ties go to the first
    chosen_from = sorted((e for e in entries if e.split == spec.select_on and e.candidate in seen),
                         key=lambda e: seen[e.candidate])
    order = grid_order(spec)
    for method in sorted(finished, key=order.index):
        pick = select(method, chosen_from, spec.select_on)
        if pick is None:
            notes.append(f"{method}: no candidate could be scored, so none is selected")
        else:
            selected[method] = pick


def best_of_chosen(spec: SweepSpec, entries: list[Entry], selected: dict[str, Candidate]) -> Candidate | None:
    """The selected candidate with the highest selection-split average (ties: the first method in grid order)."""
    valid = {e.candidate: e for e in entries if e.kind == CANDIDATE and e.split == spec.select_on}
    best = None
    for method in grid_order(spec):
        c = selected.get(method)
        if c is not None and (best is None or valid[c].average > valid[best].average):
            best = c
    return best


def mark_and_order(entries: list[Entry], spec: SweepSpec, chosen: set[Candidate], best: Candidate | None,
                   seen: dict[Candidate, tuple[int, int]], labels: list[str]) -> None:
    """Flag the selected and the best entries and sort them in place: the selection split, then the report
    split; candidates in the order of the grids (each grid's in its own order), then the base and the agents."""
    for e in entries:
        e.selected = e.candidate in chosen
        e.best = e.candidate is not None and e.candidate == best
    entries.sort(key=lambda e: (e.split != spec.select_on, e.kind != CANDIDATE,
                                seen[e.candidate] if e.kind == CANDIDATE else (labels.index(e.label), 0)))

"""The records of a sweep: what to sweep (`SweepSpec`), one scoring (`Job`), one row of the results (`Entry`) and
where a running sweep stands (`SweepProgress`). evaluation/sweep.py runs them; evaluation/selection.py chooses
among them."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from .base import Evaluator
from .grid import Candidate, Grid

CANDIDATE, REFERENCE = "candidate", "reference"


@dataclass(frozen=True)
class Job:
    """One scoring: a candidate (merged into the model first) or input model `index` (0 = base), on `split`."""

    split: str
    candidate: Candidate | None = None
    index: int | None = None

    @property
    def kind(self) -> str:
        return CANDIDATE if self.candidate is not None else REFERENCE


@dataclass
class Entry:
    """One row of the results: a scored candidate or reference model on one split."""

    kind: str
    label: str
    split: str
    method: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    settings: str = ""
    scores: dict[str, float] = field(default_factory=dict)
    detail: dict[str, float] = field(default_factory=dict)
    n: dict[str, int] = field(default_factory=dict)
    average: float = float("nan")
    merge_s: float = 0.0
    fisher_s: float = 0.0  # the Fisher pass behind a Fisher candidate (seconds of compute, all agents, to its N)
    eval_s: float = 0.0
    selected: bool = False
    best: bool = False
    resumed: bool = False
    error: str | None = None
    lambdas: list[float] | None = None
    candidate: Candidate | None = field(default=None, repr=False, compare=False)
    # noise (evaluation/verdicts.py): s.e. in points, per-example outcomes, within noise, a chosen one's grid edges
    stderr: dict[str, float] = field(default_factory=dict)
    average_stderr: float | None = None  # √(Σ se²)/k over the tasks
    detail_stderr: dict[str, float] = field(default_factory=dict)
    outcomes: dict[str, list[float]] = field(default_factory=dict, repr=False)
    within_noise: bool | None = None
    within_noise_method: bool | None = None
    grid_edge: dict[str, list[float]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and not math.isnan(self.average)


@dataclass
class SweepSpec:
    """What to sweep: the models, the grids, the evaluator, and the protocol's splits."""

    base: str
    agents: list[str]
    grids: list[Grid]
    evaluator: Evaluator
    select_on: str = "validation"
    report_on: str = "test"
    limit: int | None = None
    on_mismatch: str = "error"
    device: str = "auto"
    inputs: str = "auto"  # auto | resident | stream (evaluation/candidates.py)
    references: bool = True  # score the base and the agents on the report split too
    # Builds the evaluator where a worker runs (a Ray worker: its own device); None: workers use `evaluator`.
    make_evaluator: Callable[[], Evaluator] | None = None
    fisher_tasks: list[str] | None = None  # each agent's task for Fisher candidates (None: by agent name)


@dataclass
class SweepProgress:
    """Where a sweep stands: `phase` (open | select | report), scorings done of all known so far, the one
    running now and its own progress (examples scored of all), the entries so far."""

    phase: str
    done: int
    total: int
    current: str
    examples_done: int = 0
    examples_total: int = 0
    elapsed: float = 0.0
    entries: list[Entry] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        part = self.examples_done / self.examples_total if self.examples_total else 0.0
        return min(1.0, (self.done + part) / self.total) if self.total else 0.0


SweepProgressFn = Callable[[SweepProgress], None]

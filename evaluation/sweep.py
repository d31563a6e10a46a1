"""A sweep: score merge candidates and choose among them by the paper's protocol.

1. Every candidate of every grid is merged (in memory, evaluation/candidates.py) and scored on the selection
   split (validation). Grids taking a value from another method's choice (`lambda=@task_arithmetic`) run
   once that method is chosen.
2. Each method's best candidate is chosen from its selection-split scores alone (`select`, which is only
   ever given those); the best overall is the best of the chosen, by the same scores.
3. Only the chosen candidates are scored on the report split (test), with the base and the agents next to
   them (references).
Every score is kept on disk as soon as it exists (evaluation/store.py), so a sweep stopped half way resumes
where it stopped. Scoring runs on an executor (evaluation/executors.py): in this process, or as Ray tasks.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from analysis.noise import average_se, unpack_outcomes
from merging.common.errors import Cancelled, RamStudioError, printable

from . import verdicts
from .base import Evaluator
from .grid import Candidate, Grid, stages
from .selection import best_of_chosen, grid_order, mark_and_order, select, select_finished  # noqa: F401 (select)
from .store import ScoreStore, score_key
from .sweep_records import CANDIDATE, REFERENCE, Entry, Job, SweepProgress, SweepProgressFn, SweepSpec


@dataclass
class SweepResult:
    """Every entry (candidates on the selection split, the chosen ones and references on the report split),
    each method's chosen candidate and the best overall."""

    spec: SweepSpec
    entries: list[Entry]
    selected: dict[str, Candidate]
    best: Candidate | None
    context: dict[str, Any]
    seconds: float
    notes: list[str] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)  # chosen vs chosen on the report split

    def candidates(self, split: str | None = None) -> list[Entry]:
        return [e for e in self.entries if e.kind == CANDIDATE and (split is None or e.split == split)]

    def references(self) -> list[Entry]:
        return [e for e in self.entries if e.kind == REFERENCE]


def check_splits(evaluator: Evaluator, select_on: str, report_on: str) -> None:
    """The protocol's splits must exist, differ, and never select on test."""
    have = tuple(evaluator.splits())
    for what, split in (("selection", select_on), ("report", report_on)):
        if split not in have:
            raise RamStudioError(f"the {what} split {printable(split, 40)!r} does not exist for these tasks.",
                                 f"Splits available: {', '.join(have) or 'none'}.")
    if select_on == "test":
        raise RamStudioError("--select-on test would choose settings on the test split.",
                             "Select on validation and report test (the paper's protocol).")
    if select_on == report_on:
        raise RamStudioError(f"selecting and reporting on the same split ({select_on}) reports a tuned score.",
                             "Report on another split than the one you select on.")


def check_agents(grids: list[Grid], agents: list[str]) -> None:
    """Every method of the sweep can merge this many agents (else one clear line before anything runs)."""
    from merging.methods import get_method

    for g in grids:
        need = get_method(g.method).min_agents
        if len(agents) < need:
            raise RamStudioError(f"{g.method} merges at least {need} agents; the sweep has {len(agents)}.",
                                 "Add agents, or drop that grid.")


def _entry(job: Job, result: dict[str, Any], labels: list[str], resumed: bool) -> Entry:
    if job.candidate is not None:
        c = job.candidate
        e = Entry(CANDIDATE, c.label, job.split, c.method, c.param_dict, c.settings, candidate=c)
    else:
        e = Entry(REFERENCE, labels[job.index], job.split)
    e.error = result.get("error")
    e.scores = dict(result.get("scores", {}))
    e.detail = dict(result.get("detail", {}))
    e.n = dict(result.get("n", {}))
    e.stderr, e.detail_stderr = dict(result.get("stderr", {})), dict(result.get("detail_stderr", {}))
    e.outcomes = unpack_outcomes(result.get("outcomes"))
    e.average_stderr = average_se(e.stderr.get(t) for t in e.scores) if e.scores else None
    e.average = float(result["average"]) if result.get("average") is not None else float("nan")
    e.merge_s = float(result.get("merge_s", 0.0))
    e.fisher_s = float(result.get("fisher_s", 0.0))
    e.eval_s = float(result.get("eval_s", 0.0))
    e.lambdas = result.get("lambdas")
    e.resumed = resumed
    return e


class Executor:
    """Where scorings run (evaluation/executors.py): `start` opens the inputs and returns the context every
    score depends on; `run` scores jobs and calls `on_result(job, result)` for each as it finishes."""

    name = "local"

    def start(self, spec: SweepSpec, cancel: threading.Event | None,
              progress: Callable[[str, int, int], None] | None) -> dict[str, Any]:
        raise NotImplementedError

    def run(self, jobs: list[Job], on_result: Callable[[Job, dict[str, Any]], None],
            cancel: threading.Event | None, on_examples: Callable[[int, int, str], None] | None) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Scoring:
    """Jobs scored on a started executor through the store: a stored result is reused, a new one is stored the
    moment it exists. Keeps the entries and reports progress (`phase`, scorings done of `total`)."""

    def __init__(self, spec: SweepSpec, executor: Executor, store: ScoreStore, progress: SweepProgressFn | None,
                 cancel: threading.Event | None, total: int) -> None:
        self.spec, self.executor, self.store, self.progress, self.cancel = spec, executor, store, progress, cancel
        self.entries: list[Entry] = []
        self.phase, self.done, self.total, self.current = "open", 0, total, ""
        self.t0 = time.perf_counter()
        self.context: dict[str, Any] = {}

    def report(self, examples_done: int = 0, examples_total: int = 0) -> None:
        if self.progress is not None:
            self.progress(SweepProgress(self.phase, self.done, self.total, self.current, examples_done,
                                        examples_total, time.perf_counter() - self.t0, list(self.entries)))

    def start(self) -> dict[str, Any]:
        """Open the inputs on the executor (progress as `open`); the context every score depends on."""
        def opening(text: str, done: int, total: int) -> None:
            self.current = text
            self.report(done, total)

        self.report()
        self.store.check(store_inputs(self.spec))  # the score store is never in, over or around an input
        self.context = self.executor.start(self.spec, self.cancel, opening)
        return self.context

    def key(self, job: Job) -> dict[str, Any]:
        what = ({"method": job.candidate.method, "params": job.candidate.param_dict} if job.candidate
                else {"model": self.context["fingerprints"][job.index]})
        if job.candidate is not None and "fisher" in self.context:  # whose data each agent's Fisher is on
            from .fisher import reads_fisher

            what.update({"fisher": self.context["fisher"]} if reads_fisher(job.candidate.method) else {})
        return score_key(self.context["key"], what, job.split)

    def score(self, jobs: list[Job], phase: str) -> list[Entry]:
        """Score `jobs` (stored ones from the store); returns their entries, in the order they came."""
        self.phase = phase
        labels = self.context["labels"]
        first = len(self.entries)
        todo = []
        for job in jobs:
            hit = self.store.get(self.key(job))
            if hit is not None and "outcomes" not in hit and "error" not in hit:
                hit = None  # stored before per-example outcomes were kept: scored again to have them
            if hit is not None:
                self.entries.append(_entry(job, hit, labels, resumed=True))
                self.done += 1
            else:
                todo.append(job)
        self.report()

        def on_result(job: Job, result: dict[str, Any]) -> None:
            self.store.put(self.key(job), result)
            self.entries.append(_entry(job, result, labels, resumed=False))
            self.done += 1
            self.current = ""
            self.report()

        def on_examples(done: int, total: int, text: str) -> None:
            self.current = text
            self.report(done, total)

        if todo:
            self.executor.run(todo, on_result, self.cancel, on_examples)
        return self.entries[first:]


def store_inputs(spec: SweepSpec) -> list:
    """What the score store may not be, contain or sit inside: the models and an lm-eval task folder."""
    from pathlib import Path

    from merging.writing.placement import input_folders, protected_paths

    inputs = input_folders([spec.base, *spec.agents])
    include = getattr(spec.evaluator, "include_path", None)
    return inputs + (protected_paths([("--include-path", Path(include))]) if include else [])


def measure(spec: SweepSpec, candidates: list[Candidate], split: str, executor: Executor, *,
            store: ScoreStore | None = None, progress: SweepProgressFn | None = None,
            cancel: threading.Event | None = None) -> list[Entry]:
    """Score given candidates on one split (no selection): e.g. the Tune page's settings A and B. `spec`
    gives the models and the evaluator (its grids are not used)."""
    if split not in tuple(spec.evaluator.splits()):
        raise RamStudioError(f"the split {printable(split, 40)!r} does not exist for these tasks.",
                             f"Splits available: {', '.join(spec.evaluator.splits())}.")
    scoring = Scoring(spec, executor, store or ScoreStore(), progress, cancel, len(candidates))
    try:
        scoring.start()
        got = {e.candidate: e for e in scoring.score([Job(split, c) for c in candidates], "measure")}
        return [got[c] for c in candidates]  # in the order asked for (stored ones come back first)
    except KeyboardInterrupt:
        raise Cancelled("interrupted.") from None
    finally:
        executor.close()


def run_sweep(spec: SweepSpec, executor: Executor, *, store: ScoreStore | None = None,
              progress: SweepProgressFn | None = None, cancel: threading.Event | None = None) -> SweepResult:
    """Run the protocol (see the module docstring); raises Cancelled when `cancel` is set (scores so far kept)."""
    plan = stages(spec.grids)
    check_splits(spec.evaluator, spec.select_on, spec.report_on)
    check_agents(spec.grids, spec.agents)
    run = Scoring(spec, executor, store or ScoreStore(), progress, cancel, sum(g.size() for g in spec.grids))
    selected: dict[str, Candidate] = {}
    seen: dict[Candidate, tuple[int, int]] = {}  # each candidate's place: (its grid, its place in the grid)
    notes: list[str] = []
    try:
        labels = run.start()["labels"]
        for i, stage in enumerate(plan):
            run.score(_stage_jobs(stage, spec, run, selected, seen, notes), "select")
            finished = {g.method for g in stage} - {g.method for later in plan[i + 1:] for g in later}
            select_finished(finished, spec, run.entries, seen, selected, notes)
        best = best_of_chosen(spec, run.entries, selected)
        reports = [Job(spec.report_on, selected[m]) for m in sorted(selected, key=grid_order(spec).index)]
        if spec.references:
            reports += [Job(spec.report_on, index=i) for i in range(len(labels))]
        run.total += len(reports)
        run.score(reports, "report")
    except KeyboardInterrupt:
        raise Cancelled("sweep interrupted.") from None
    finally:
        executor.close()
    mark_and_order(run.entries, spec, set(selected.values()), best, seen, labels)
    comparisons = verdicts.judge(run.entries, spec.select_on, spec.report_on, selected, best, notes)
    run.phase, run.current = "done", ""
    run.report()
    damaged = [run.store.note()] if run.store.note() else []
    return SweepResult(spec, run.entries, selected, best, run.context, time.perf_counter() - run.t0,
                       notes + run.context.get("notes", []) + damaged, comparisons)


def _stage_jobs(stage, spec: SweepSpec, run: Scoring, selected: dict[str, Candidate],
                seen: dict[Candidate, tuple[int, int]], notes: list[str]) -> list[Job]:
    """The selection-split jobs of one stage: each grid's candidates not scored before (a grid whose @METHOD
    reference has no selected candidate is skipped, with a note); `run.total` follows what is left out."""
    jobs = []
    for grid in stage:
        if any(ref not in selected for ref in grid.refs.values()):
            missing = [r for r in grid.refs.values() if r not in selected]
            notes.append(f"{grid.text}: skipped, no {', '.join(missing)} candidate could be scored")
            run.total -= grid.size()
            continue
        for pos, c in enumerate(grid.expand(selected)):
            if c not in seen:
                seen[c] = (spec.grids.index(grid), pos)
                jobs.append(Job(spec.select_on, c))
            else:
                run.total -= 1
    return jobs

"""The paper's Fig. 3 on the demo: keep only one agent's *unique* region, whole or divided by N.

For each agent a, two merges of the base and every agent: `unique_only` with `agent = a` (the base plus τ_a
where no other agent changed the element, ε = 1e-5) and the same with `dilute` (that update divided by N,
which is what averaging does to a unique element). Each is scored greedily next to the base and the full
agents (rows of their own). Whatever it shows is the direct measurement of signal dilution on these agents.

One implementation (`run_experiment`) serves the command line (every task, validation and test, written to
`fig3.csv` / `fig3.md`) and the app's Signal dilution page (each agent's own task on test, as a background
job with progress and cancel). The merges go through `merge_to_folder`, the function `ram-studio merge` runs.

    python -m demo.fig3 [--models assets/demo/models] [--out assets/demo/results]
    python -m demo.fig3 --models assets/demo/models-shared --out assets/demo/results-shared

Writes `fig3.csv` (tidy: agent, variant, task, subset, split, n, correct, accuracy; variant is
`base`, `unique`, `unique_div_N` or `agent`) and `fig3.md`.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from merging.common.errors import Cancelled

from . import evaluate
from .table1 import AGENTS, DEMO_DIR, trio_name
from .tasks import TASKS, eval_set

SPLITS = ("validation", "test")
VARIANTS = {"unique": False, "unique_div_N": True}
# The tidy schema the app's Signal-dilution page reads (analysis/fig3.py): base rows leave `agent` empty.
COLUMNS = ["agent", "variant", "task", "subset", "split", "n", "correct", "accuracy"]
# The app's rows: the 'all' subset only, accuracy in %, and the examples behind it (its standard error).
PERCENT_COLUMNS = ["agent", "variant", "task", "split", "accuracy", "n"]

StepFn = Callable[[float, str], None]  # (fraction of the experiment done, "step k of n: what")


# Rough throughputs for the app's estimate of the experiment on selected models. Reading and writing weights:
# the Models page's disk assumption. Scoring: the demo evaluator's greedy decoding costs about this many seconds
# per model parameter and example, measured here on the demo (0.33 M parameters, 300 test examples per task:
# 0.6-1.4 s per task on a 2-core CPU, model loading included, other jobs running); and each merge has a fixed
# cost (opening the models, writing and loading the folder: 0.2-0.8 s on the demo, measured the same way).
READ_BPS = 400e6
EVAL_SECONDS_PER_PARAM_EXAMPLE = 1e-8
STEP_SECONDS = 0.5


def estimate_seconds(n_agents: int, params: int, bytes_per_model: int, examples_per_merge: list[int],
                     examples_of_references: int = 0) -> float:
    """The Fig. 3 job's duration from the models' size: 2·N unique_only merges (each reads the base and every
    agent and writes one model), each scored on `examples_per_merge` examples (its agent's own task), plus the
    base and the agents when their scores are not at hand."""
    merges = 2 * n_agents * ((n_agents + 2) * bytes_per_model / READ_BPS + STEP_SECONDS)
    scoring = (2 * sum(examples_per_merge) + examples_of_references) * params * EVAL_SECONDS_PER_PARAM_EXAMPLE
    return merges + scoring


def plan(agents: Sequence[str]) -> list[tuple[int, str, bool]]:
    """(agent index, label, dilute) for every merge of the experiment, agents given as references."""
    from merging.reading.checkpoint import unique_labels
    from merging.reading.refs import parse_ref

    labels = unique_labels([parse_ref(a).label for a in agents])
    return [(i, label, dilute) for i, label in enumerate(labels) for dilute in (False, True)]


def labels_of(agents: Sequence[str]) -> list[str]:
    """The agents' labels, in order (the names the experiment's rows carry)."""
    return list(dict.fromkeys(label for _, label, _ in plan(agents)))


def own_tasks(labels: Sequence[str]) -> dict[str, list[str]]:
    """The task each agent is scored on: the task of its name, or every task when it is not named after one."""
    return {label: [label] if label in TASKS else list(TASKS) for label in labels}


def reference_rows(accuracy_csv: Path, labels: Sequence[str], own: dict[str, list[str]],
                   split: str = "test") -> pd.DataFrame | None:
    """Base and full-agent rows (COLUMNS, 'all' subset) from a demo build's accuracy.csv (the same evaluator),
    when it has every agent; None otherwise (then they are scored in the experiment)."""
    try:
        acc = pd.read_csv(accuracy_csv, dtype={"subset": str})
    except (OSError, ValueError, pd.errors.ParserError):
        return None
    acc = acc[(acc["split"] == split) & (acc["subset"] == "all")]
    frames = [acc[acc["model"] == "base"].assign(agent="", variant="base")]
    for label in labels:
        frames.append(acc[(acc["model"] == label) & acc["task"].isin(own[label])].assign(agent=label,
                                                                                         variant="agent"))
    rows = pd.concat(frames, ignore_index=True)
    if rows.empty or not all((rows["agent"] == label).any() for label in labels):
        return None
    return rows.reindex(columns=COLUMNS)


def estimate(base: str, agents: Sequence[str], references_known: bool) -> tuple[float, int]:
    """(seconds, parameters per model) of the experiment on these models, from their headers only (nothing is
    read or downloaded); raises RamStudioError when a model is not readable here."""
    from merging.reading.checkpoint import open_checkpoint

    sizes = []
    for ref in (base, *agents):
        with open_checkpoint(ref, download=False) as ckpt:
            sizes.append((sum(e.numel for e in ckpt.tensors.values()), ckpt.bytes_on_disk))
    params, size = max(p for p, _ in sizes), max(b for _, b in sizes)
    examples = {t: len(eval_set(t, "test")) for t in TASKS}
    per_merge = [examples[label] if label in TASKS else sum(examples.values()) for label in labels_of(agents)]
    refs = 0 if references_known else sum(examples.values()) + sum(per_merge)
    return estimate_seconds(len(agents), params, size, per_merge, refs), params


def _scored(folder: Path, tasks: list[str], split: str, limit: int | None, **row: str) -> pd.DataFrame:
    """One model's scores on `tasks` as COLUMNS rows."""
    frame = evaluate.evaluate_model(folder, tasks, split, limit)
    return frame[["task", "subset", "n", "correct", "accuracy"]].assign(split=split, **row)


def run_experiment(base: str, agents: Sequence[str], *, tasks: dict[str, list[str]] | None = None,
                   splits: Sequence[str] = ("test",), limit: int | None = None,
                   references: pd.DataFrame | None = None, step: StepFn | None = None,
                   cancel: threading.Event | None = None) -> pd.DataFrame:
    """Fig. 3 on any base and agents: for each agent, merge the base + only its unique region (whole, then ÷ N)
    into a temporary folder, score it on its tasks (`tasks`: label → tasks; default: its own task, or all when
    it is not named after one) on every split, and delete it. The base and the full agents are scored on all
    tasks and their own unless `references` (their rows) is given. Progress is counted in finished steps (a
    merge reports its own fraction) through `step`; `cancel` stops at the next merge chunk or between
    evaluations (Cancelled), and the temporary models are deleted either way. Returns COLUMNS rows."""
    from merging.merge import merge_to_folder
    from merging.reading.refs import resolve
    from merging.recipe import MergeSpec

    merges = plan(agents)
    labels = labels_of(agents)
    own = tasks or own_tasks(labels)
    to_score = [] if references is not None else [("base", "base", base)] + [
        ("agent", label, ref) for label, ref in zip(labels, agents)]
    steps = 2 * len(merges) + len(to_score) * len(splits)
    frames = [] if references is None else [references]
    done = 0

    def say(what: str, frac: float = 0.0, check: bool = True) -> None:
        if check and cancel is not None and cancel.is_set():  # inside a merge the engine polls `cancel` itself
            raise Cancelled("the Fig. 3 experiment was cancelled; its temporary models were deleted.")
        if step is not None:
            step(min(1.0, (done + frac) / steps), f"step {min(done + 1, steps)} of {steps}: {what}")

    for split in splits:
        for variant, label, ref in to_score:
            say(f"scoring the {'base' if variant == 'base' else label + ' agent'}")
            frames.append(_scored(resolve(ref), list(TASKS) if variant == "base" else own[label], split, limit,
                                  agent="" if variant == "base" else label, variant=variant))
            done += 1
    tmp = Path(tempfile.mkdtemp(prefix="ram-fig3-"))
    try:
        for index, label, dilute in merges:
            what = f"{label}'s unique region" + (" ÷ N" if dilute else "")
            say(f"merging {what}")
            out = tmp / f"{label}-{'div' if dilute else 'whole'}"
            spec = MergeSpec(base, list(agents), "unique_only", {"agent": str(index), "dilute": dilute}, str(out))
            merge_to_folder(spec, progress=lambda p, w=what: say(f"merging {w}", 0.99 * p.fraction, check=False),
                            cancel=cancel)
            done += 1
            say(f"scoring {what} on {', '.join(own[label])}")
            variant = "unique_div_N" if dilute else "unique"
            frames += [_scored(out, own[label], split, limit, agent=label, variant=variant) for split in splits]
            shutil.rmtree(out, ignore_errors=True)
            done += 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if step is not None:
        step(1.0, f"{steps} steps done")
    return pd.concat(frames, ignore_index=True)[COLUMNS]


def percent_rows(tidy: pd.DataFrame) -> pd.DataFrame:
    """The rows the app draws: the 'all' subset, accuracy in % and n (PERCENT_COLUMNS)."""
    part = tidy[tidy["subset"] == "all"]
    return part.assign(accuracy=100.0 * part["accuracy"]).reset_index(drop=True)[PERCENT_COLUMNS]


def read_results(path: Path) -> tuple[pd.DataFrame | None, str]:
    """A build's fig3.csv as the app's tidy rows [agent, variant, task, split, accuracy %] (analysis.fig3
    .normalise, which also reads the naming variants such a file may use) and its name; (None, why) when the
    file is absent, unreadable or empty."""
    from analysis.fig3 import Fig3FormatError, normalise

    if not path.exists():
        return None, f"{path.name} is not in the demo's results yet"
    try:
        tidy = normalise(pd.read_csv(path))
    except (OSError, ValueError, pd.errors.ParserError, Fig3FormatError) as exc:
        return None, f"{path.name} could not be read ({str(exc).splitlines()[0][:160]})"
    if tidy.empty:
        return None, f"{path.name} has no rows"
    return tidy, path.name


def run(models: Path, out_dir: Path, limit: int | None = None) -> pd.DataFrame:
    """Merge, score (every task, validation and test) and write `fig3.csv` / `fig3.md`; returns the tidy frame."""
    t0 = time.time()
    last = [""]

    def step(_fraction: float, text: str) -> None:
        if text != last[0]:
            print(f"  {text}", flush=True)
            last[0] = text

    tidy = run_experiment(str(models / "base"), [str(models / a) for a in AGENTS],
                          tasks={a: list(TASKS) for a in AGENTS}, splits=SPLITS, limit=limit, step=step)
    out_dir.mkdir(parents=True, exist_ok=True)
    tidy.to_csv(out_dir / "fig3.csv", index=False)
    trio = trio_name(models)
    (out_dir / "fig3.md").write_text(markdown(tidy, "test", trio) + "\n")
    print(markdown(tidy, "test", trio))
    print(f"[fig3] done in {time.time() - t0:.0f} s")
    return tidy


def markdown(tidy: pd.DataFrame, split: str = "test", trio: str = "demo") -> str:
    """Per agent: accuracy (%) on each task of the base, the unique region alone, the unique
    region divided by N, and the full agent; own-task gains relative to the base."""
    t = tidy[(tidy.split == split) & (tidy.subset == "all")]
    base = t[t.variant == "base"].set_index("task")["accuracy"]
    lines = [f"Fig. 3 on the {trio} trio ({split} split, accuracy %): base + one agent's unique region "
             "(ε = 1e-5), whole or divided by N = 3", "",
             "| unique region of | model | " + " | ".join(TASKS) + " | own-task gain vs base |",
             "|---|---|" + "---|" * len(TASKS) + "---|"]
    for agent in AGENTS:
        mine = t[t.agent == agent]
        rows = [("base", base), ("unique only", mine[mine.variant == "unique"].set_index("task")["accuracy"]),
                ("unique / N", mine[mine.variant == "unique_div_N"].set_index("task")["accuracy"]),
                (f"full {agent} agent", mine[mine.variant == "agent"].set_index("task")["accuracy"])]
        for label, series in rows:
            cells = " | ".join(f"{100 * series.loc[task]:.2f}" for task in TASKS)
            gain = 100 * (series.loc[agent] - base.loc[agent])
            lines.append(f"| {agent} | {label} | {cells} | {gain:+.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.fig3",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=DEMO_DIR / "models")
    parser.add_argument("--out", type=Path, default=DEMO_DIR / "results")
    parser.add_argument("--limit", type=int, default=None, help="examples per task and split")
    args = parser.parse_args(argv)
    run(args.models.resolve(), args.out.resolve(), args.limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())

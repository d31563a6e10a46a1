"""Score any demo-compatible model folder on the toy tasks with deterministic greedy decoding.

Usage: python -m demo.evaluate MODEL_DIR [--tasks code,tool,memory] [--split test]
       [--limit N] [--suite demo|shared] [--json FILE [--overwrite]]

Prints accuracy in % per task (and per memory length), with the count of answers that are the task's
careless habit; `ram-studio evaluate` is the product's command (the demo's tasks or lm-eval tasks).

The task suite is the one the model folder names in its config.json (`ram_studio_demo_suite`,
written by the build for the shared-skill trio and copied into every merge of it), unless --suite
says otherwise; a folder without the key is scored on the original suite.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import pandas as pd

from merging.common.errors import Cancelled

from .suites import DEMO_SUITE, SUITE_CONFIG_KEY, SUITES, TaskSuite, get_suite
from .tasks import TASKS, Example, eval_set, subset_key

if TYPE_CHECKING:  # torch and transformers load with a model: `--help` and a refused argument answer at once
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


def greedy_texts(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, prompts: Sequence[str],
                 max_new_tokens: int) -> list[str]:
    """The demo's batched greedy decoder (demo.generation), imported on first use."""
    from .generation import greedy_texts as decode

    return decode(model, tokenizer, prompts, max_new_tokens)


def greedy_outputs(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                   examples: Sequence[Example],
                   max_new_tokens: Mapping[str, int] = DEMO_SUITE.max_new_tokens) -> list[str]:
    """Greedy-decode each example (all examples of a task in one decoding batch); outputs in input order."""
    outputs = [""] * len(examples)
    for task in dict.fromkeys(e.task for e in examples):
        idx = [i for i, e in enumerate(examples) if e.task == task]
        texts = greedy_texts(model, tokenizer, [examples[i].prompt for i in idx], max_new_tokens[task])
        for i, text in zip(idx, texts):
            outputs[i] = text
    return outputs


def is_habit(example: Example, output: str) -> bool:
    """True when a wrong output is exactly the task's careless habit (what RL has to unlearn)."""
    return bool(example.habit) and example.habit != example.answer and output.strip() == example.habit


# (examples scored so far, examples in all, what is being scored)
Progress = Callable[[int, int, str], None]


def evaluate_loaded(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                    tasks: Sequence[str] | None = None, split: str = "test",
                    limit: int | None = None, suite: TaskSuite = DEMO_SUITE,
                    progress: Progress | None = None,
                    cancel: threading.Event | None = None) -> pd.DataFrame:
    """Tidy accuracy table for an already-loaded model (used during training too); `habit`
    counts outputs that are the careless habit answer; a suite with an answer envelope adds
    `format_slip` (wrong only for the missing envelope: the answer or habit written bare).
    `tasks` defaults to the suite's; `progress` is told after each task, `cancel` is checked
    before each task (Cancelled when set). `df.attrs["outcomes"]` holds each task's per-example results
    (1 right, 0 wrong, in the evaluation set's order): what paired comparisons of two models need."""
    tasks = suite.tasks if tasks is None else tuple(tasks)
    sets = {task: suite.eval_set(task, split, limit) for task in tasks}
    total, done = sum(len(v) for v in sets.values()), 0
    rows = []
    outcomes: dict[str, list[int]] = {}
    import torch

    torch.manual_seed(0)
    for task in tasks:
        if cancel is not None and cancel.is_set():
            raise Cancelled("evaluation cancelled.")
        examples = sets[task]
        outputs = greedy_outputs(model, tokenizer, examples, max_new_tokens=suite.max_new_tokens)
        frame = pd.DataFrame({"subset": [e.subset for e in examples],
                              "ok": [suite.verify(e, o) for e, o in zip(examples, outputs)],
                              "habit": [is_habit(e, o) for e, o in zip(examples, outputs)],
                              "format_slip": [suite.is_format_slip(e, o)
                                              for e, o in zip(examples, outputs)]})
        outcomes[task] = [int(bool(v)) for v in frame["ok"]]
        groups = [("all", frame)]
        if task in suite.subset_tasks:
            groups += sorted(frame.groupby("subset"), key=lambda kv: subset_key(kv[0]))
        for subset, grp in groups:
            rows.append({"task": task, "subset": subset, "n": len(grp),
                         "correct": int(grp["ok"].sum()), "habit": int(grp["habit"].sum()),
                         "format_slip": int(grp["format_slip"].sum())})
        done += len(examples)
        if progress is not None:
            progress(done, total, f"{task}: {len(examples)} examples scored")
    columns = ["task", "subset", "n", "correct", "habit"] + (["format_slip"] if suite.enveloped else [])
    df = pd.DataFrame(rows, columns=columns)
    df["accuracy"] = df["correct"] / df["n"]
    df.attrs["outcomes"] = outcomes
    return df


def evaluate_model(model_dir: Path, tasks: Sequence[str] | None = None, split: str = "test",
                   limit: int | None = None, suite: TaskSuite | None = None) -> pd.DataFrame:
    """Load a model folder (bf16 weights upcast to fp32) and return its tidy accuracy table, on
    `suite` or else on the suite the folder's config.json names (`suite_of_folder`)."""
    import torch

    from .modeling import load_checkpoint

    torch.set_num_threads(max(1, torch.get_num_threads()))
    suite = suite or suite_of_folder(Path(model_dir))
    model, tokenizer = load_checkpoint(Path(model_dir))
    return evaluate_loaded(model, tokenizer, tasks, split, limit, suite)


MAX_CONFIG_BYTES = 4 << 20


def suite_of_folder(model_dir: Path) -> TaskSuite:
    """The task suite a model folder's config.json names (the original suite when it names none).
    Raises ValueError for an unreadable config or a suite name this demo does not know."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return DEMO_SUITE
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"config.json is larger than {MAX_CONFIG_BYTES >> 20} MB")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"config.json is not readable JSON ({exc})") from None
    name = config.get(SUITE_CONFIG_KEY) if isinstance(config, dict) else None
    if name is None:
        return DEMO_SUITE
    if not isinstance(name, str) or name not in SUITES:
        raise ValueError(f"config.json names an unknown task suite {str(name)[:40]!r} in "
                         f"{SUITE_CONFIG_KEY}; expected one of {sorted(SUITES)}")
    return SUITES[name]


def summary_row(df: pd.DataFrame, stderr: bool = False) -> dict[str, float]:
    """One wide row: accuracy (%) per task, per memory length, and the mean over the three tasks; with `stderr`,
    each one's standard error too (`<key>_se`: binomial, √(Σ se²)/k for the mean)."""
    from analysis.noise import average_se, binomial_se

    row: dict[str, float] = {}
    exact: dict[str, float] = {}
    ses: dict[str, float | None] = {}
    for rec in df.itertuples():
        key = rec.task if rec.subset == "all" else f"{rec.task}@{rec.subset}"
        exact[key] = 100.0 * rec.accuracy
        row[key] = round(exact[key], 2)
        ses[key] = binomial_se(exact[key], int(rec.n))
    tasks = [t for t in TASKS if t in row]
    if tasks:  # mean of the unrounded accuracies, rounded once
        row["avg"] = round(sum(exact[t] for t in tasks) / len(tasks), 2)
        ses["avg"] = average_se(ses[t] for t in tasks)
    if stderr:
        row.update({f"{k}_se": round(v, 2) for k, v in ses.items() if v is not None})
    return row


def summary_table(results: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Wide table (rows = model names) from several tidy evaluation frames."""
    return pd.DataFrame({name: summary_row(df) for name, df in results.items()}).T


def score_all_tasks(model_dir: Path, split: str = "test",
                    progress: Callable[[int, int, str], None] | None = None) -> dict[str, float]:
    """Score a folder on every demo task, one task at a time so that `progress(done, total, text)` counts the
    examples actually scored; returns its summary row (accuracy %, avg, and their standard errors `…_se`)."""
    sizes = {t: len(eval_set(t, split)) for t in TASKS}
    total, done = sum(sizes.values()), 0
    frames = []
    for i, task in enumerate(TASKS):
        text = f"scoring {task} (task {i + 1} of {len(TASKS)}, {sizes[task]} examples)"
        if progress is not None:
            progress(done, total, text)
        frames.append(evaluate_model(model_dir, [task], split=split))
        done += sizes[task]
        if progress is not None:
            progress(done, total, text)
    return summary_row(pd.concat(frames, ignore_index=True), stderr=True)


def results_table(results: Path) -> tuple[pd.DataFrame | None, str]:
    """A demo build's comparison table (rows = models, accuracy % per task + avg, and each one's standard error
    `<column>_se` where measured) and the file it came from: table1.csv (base, agents and every merge) when
    present, else accuracy.csv (base and agents only)."""
    table1, acc = results / "table1.csv", results / "accuracy.csv"
    if table1.exists():
        t = pd.read_csv(table1)
        return t.set_index(t.columns[0]).drop(columns=["params", "val_avg", "val_avg_se", "n", "grid_edge"],
                                              errors="ignore"), "table1.csv"
    if acc.exists():
        a = pd.read_csv(acc, dtype={"subset": str})
        split = "test" if (a["split"] == "test").any() else a["split"].iloc[0]
        a = a[a["split"] == split]
        groups = dict(tuple(a.groupby("model", sort=False)))
        return pd.DataFrame({name: summary_row(df, stderr=True) for name, df in groups.items()}).T, "accuracy.csv"
    return None, ""


def results_comparisons(results: Path) -> pd.DataFrame | None:
    """A demo build's paired comparisons of the chosen merges (table1_comparisons.csv), or None."""
    path = results / "table1_comparisons.csv"
    return pd.read_csv(path) if path.exists() else None


def with_stderr(table: pd.DataFrame) -> pd.DataFrame:
    """A score table for display: each column with a `<column>_se` sibling as `22.33 ± 2.40` text (the value alone
    where its standard error is missing); the `_se` columns folded in."""
    out = table.drop(columns=[c for c in table.columns if str(c).endswith("_se")])
    for c in out.columns:
        se = f"{c}_se"
        if se in table.columns:
            out[c] = [("–" if pd.isna(v) else f"{v:.2f}" if pd.isna(e) else f"{v:.2f} ± {e:.2f}")
                      for v, e in zip(table[c], table[se])]
    return out


def comparison_table(session_rows: Mapping[str, dict], measured: pd.DataFrame | None) -> pd.DataFrame | None:
    """Rows scored in this session (newest first) above a build's measured rows; None when there are neither."""
    frames = []
    if session_rows:
        frames.append(pd.DataFrame(session_rows).T.iloc[::-1])
    if measured is not None:
        frames.append(measured)
    return pd.concat(frames) if frames else None


def format_table(table: pd.DataFrame) -> str:
    """Markdown rendering of a summary table (no extra dependencies)."""
    cols = ["model"] + [str(c) for c in table.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, row in table.iterrows():
        cells = [f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.tolist()]
        lines.append("| " + " | ".join([str(name)] + cells) + " |")
    return "\n".join(lines)


# What the printed table's columns mean (the JSON keeps the raw counts and the accuracy as a fraction).
COLUMN_NOTES = {
    "habit answers": "wrong outputs that are exactly the task's careless habit, the answer RL has to unlearn",
    "format slips": "outputs wrong only for the missing answer envelope (the answer or the habit written bare)",
}


def display_table(df: pd.DataFrame) -> pd.DataFrame:
    """The tidy table as the terminal shows it: accuracy in % and the habit counts named for what they are."""
    shown = df.rename(columns={"habit": "habit answers", "format_slip": "format slips"}).drop(columns=["accuracy"])
    shown["accuracy %"] = (100 * df["accuracy"]).map("{:.2f}".format)
    return shown


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m demo.evaluate FOLDER`: score one demo-compatible folder (the demo's own tool; the
    product's command is `ram-studio evaluate`)."""
    parser = argparse.ArgumentParser(prog="python -m demo.evaluate", description=__doc__.splitlines()[0],
                                     epilog="Accuracy is printed in %. " + " ".join(
                                         f"'{k}': {v}." for k, v in COLUMN_NOTES.items()))
    parser.add_argument("model", help="model folder (base, agent or merged export)")
    parser.add_argument("--tasks", default=",".join(TASKS), metavar="TASK[,TASK]",
                        help=f"tasks to score, comma-separated (default {','.join(TASKS)})")
    parser.add_argument("--split", default="test", choices=["train", "validation", "test"],
                        help="which split to score (default test)")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="score only the first N examples of each task (a quick look)")
    parser.add_argument("--suite", default=None, choices=sorted(SUITES),
                        help="task suite (default: the one config.json names, else the original demo tasks)")
    parser.add_argument("--json", dest="json_path", default=None, metavar="FILE",
                        help="also write the raw counts and accuracies (fractions) as JSON; never inside the model "
                             "folder, never over a file without --overwrite")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        parser.error(f"unknown task(s) {unknown}; choose from {list(TASKS)}")
    if not Path(args.model).is_dir():
        parser.error(f"model folder not found: {args.model}")
    try:
        suite = get_suite(args.suite) if args.suite else suite_of_folder(Path(args.model))
    except ValueError as exc:
        parser.error(str(exc))
    out = None
    if args.json_path:
        from merging.common.errors import RamStudioError
        from merging.writing.checked_output import check_output_file
        from merging.writing.placement import protected_paths

        try:
            out = check_output_file(args.json_path, protected_paths([(args.model, Path(args.model))]),
                                    overwrite=args.overwrite)
        except RamStudioError as exc:
            parser.error(f"{exc.message} {exc.hint}")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # transformers' "Loading weights" bars would fill stderr
    df = evaluate_model(Path(args.model), tasks, args.split, args.limit, suite)
    shown = display_table(df)
    print(f"suite: {suite.name} ({suite.description})")
    print(shown.to_string(index=False))
    for column, note in COLUMN_NOTES.items():
        if column in shown.columns:
            print(f"{column}: {note}")
    if out is not None:
        from merging.writing.checked_output import write_file_atomically

        payload = {"model": str(args.model), "split": args.split, "suite": suite.name,
                   "results": df.to_dict("records"), "summary": summary_row(df)}
        write_file_atomically(out, (json.dumps(payload, indent=2) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

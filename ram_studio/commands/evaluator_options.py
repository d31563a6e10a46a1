"""Choosing and showing an evaluation from the command line: the evaluator options `evaluate` and `sweep` share
(`add_evaluator_options`, `build_evaluator`), the progress line and the results table."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from merging.common.errors import RamStudioError, printable


def quiet_library_progress() -> None:
    """Keep lm-eval's and transformers' own progress bars off (tqdm reads its settings once, when first imported)."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def add_evaluator_options(sp: argparse.ArgumentParser) -> None:
    """--tasks | --lm-eval [--include-path] and the harness's backend settings."""
    from demo.suites import SUITES
    from demo.tasks import TASKS

    sp.add_argument("--tasks", default=None, metavar="TASK[,TASK]",
                    help=f"demo tasks to score, comma-separated (default {','.join(TASKS)}; `ram-studio tasks` lists "
                         "them); the demo's built-in evaluator: greedy decoding, the tasks' verifiers")
    sp.add_argument("--suite", default=None, metavar="|".join(SUITES),
                    help="the demo's task suite: demo (the original tasks) or shared (answers in one common envelope); "
                         "default: the suite the model's config.json names (every demo-shared: model and its merges), "
                         "else demo")
    sp.add_argument("--lm-eval", dest="lm_eval", default=None, metavar="TASK[,TASK]",
                    help="score on lm-evaluation-harness tasks instead (task or group names, comma-separated; "
                         "needs ram-studio[eval]); e.g. ram_demo_tool with --include-path assets/demo/lm_eval_tasks")
    sp.add_argument("--include-path", default=None, metavar="DIR",
                    help="a folder of lm-eval task YAML files (as lm_eval's --include_path); when it holds every "
                         "task asked for, lm-eval's built-in tasks are not read")
    sp.add_argument("--backend", default="auto", metavar="auto|hf|vllm",
                    help="lm-eval backend: hf (transformers, the model held in memory) or vllm; auto = vllm when it "
                         "is installed and a GPU is present, else hf")
    sp.add_argument("--device", default="auto", help="lm-eval device: auto (CUDA when present), cpu or cuda")
    sp.add_argument("--batch-size", default=None, metavar="N|auto",
                    help="lm-eval batch size (default 64 on the CPU, auto on a GPU)")


def build_evaluator(args: argparse.Namespace, suite_folder: Path | None = None):
    """The evaluator the options ask for (DemoEvaluator or LmEvalEvaluator); a RamStudioError for a bad option or
    an unknown task, before any model is loaded. The demo's suite: --suite, else the one `suite_folder`'s
    config.json names, else the original tasks."""
    if args.lm_eval is not None:
        if args.tasks is not None:
            raise RamStudioError("--tasks (demo tasks) and --lm-eval (harness tasks) exclude each other.",
                                 "Give one of them.")
        if args.suite is not None:
            raise RamStudioError("--suite chooses the demo's task suite: it goes with the demo tasks, not --lm-eval.",
                                 "Drop --suite.")
        from evaluation.lm_eval_backend import LmEvalEvaluator

        batch = args.batch_size
        if batch is not None and batch != "auto":
            try:
                batch = int(batch)
                assert batch >= 1
            except (ValueError, AssertionError):
                raise RamStudioError(f"--batch-size {printable(args.batch_size)} is not a positive number.",
                                     "Give a number of examples, or auto.") from None
        names = [t for t in args.lm_eval.split(",") if t.strip()]
        return LmEvalEvaluator(names, args.include_path, backend=args.backend, device=args.device, batch_size=batch)
    if args.include_path is not None:
        raise RamStudioError("--include-path is a folder of lm-eval tasks: it goes with --lm-eval.",
                             "Add --lm-eval TASKS, or drop --include-path.")
    from demo.evaluate import suite_of_folder
    from demo.evaluator import DemoEvaluator
    from demo.suites import get_suite

    if args.suite is not None:
        try:
            suite = get_suite(args.suite)
        except ValueError:
            raise RamStudioError(f"unknown task suite {printable(args.suite, 40)!r}.",
                                 "Choose --suite demo or shared.") from None
    elif suite_folder is not None:
        try:
            suite = suite_of_folder(suite_folder)
        except ValueError as exc:
            raise RamStudioError(f"cannot tell the task suite of {suite_folder}: {exc}.",
                                 "Pass --suite demo or --suite shared.") from None
    else:
        suite = get_suite(None)
    names = [t.strip() for t in (args.tasks or ",".join(suite.tasks)).split(",") if t.strip()]
    return DemoEvaluator(names, suite=suite)


def progress_printer(label: str):
    """Examples scored so far on stderr: one line rewritten on a terminal, a line per step otherwise."""
    tty = sys.stderr.isatty()
    start = time.monotonic()

    def show(done: int, total: int, what: str) -> None:
        line = f"{label}: {done}/{total} examples · {printable(what, 80)} · {time.monotonic() - start:.1f} s"
        sys.stderr.write(("\r\033[K" + line + ("\n" if done >= total else "")) if tty else line + "\n")
        sys.stderr.flush()

    return show


def display_frame(frame, scores):
    """What the terminal shows: per task (and per memory length) examples, correct, accuracy in % and its
    standard error (binomial on the demo's tasks, lm-eval's own on lm-eval tasks; – where there is none)."""
    import pandas as pd

    from analysis.noise import binomial_se

    def se_text(se) -> str:
        return "–" if se is None else f"{se:.2f}"

    if frame is not None:
        shown = frame[["task", "subset", "n", "correct"]].copy()
        shown["accuracy %"] = (100 * frame["accuracy"]).map("{:.2f}".format)
        shown["± s.e."] = [se_text(binomial_se(100 * a, int(n))) for a, n in zip(frame["accuracy"], frame["n"])]
        return shown
    return pd.DataFrame({"task": list(scores.scores), "n": [scores.n.get(t, 0) for t in scores.scores],
                         "score %": [f"{v:.2f}" for v in scores.scores.values()],
                         "± s.e.": [se_text(scores.stderr.get(t)) for t in scores.scores]})

"""The demo's tasks as an `evaluation.base.Evaluator`: load a demo-compatible folder once, score it in memory
with greedy decoding and the tasks' verifiers (accuracy in %)."""
from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from analysis.noise import binomial_se
from evaluation.base import EvalProgress, LoadedModel, Scores
from evaluation.quiet import quiet_libraries
from merging.common.errors import RamStudioError, first_line

from .suites import DEMO_SUITE, TaskSuite

DECODER_VERSION = "greedy-1"  # bump when decoding could change an output (part of the fingerprint)
FISHER_DATA = "train-1"  # bump when the Fisher's examples or their budgets change (part of the Fisher's cache key)


class DemoEvaluator:
    """Scores a model on a suite of the demo's tasks (default: code, tool, memory) with greedy decoding."""

    name = "demo"

    def __init__(self, tasks: Sequence[str] | None = None, suite: TaskSuite = DEMO_SUITE) -> None:
        chosen = tuple(suite.tasks if tasks is None else tasks)
        unknown = [t for t in chosen if t not in suite.tasks]
        if unknown or not chosen:
            raise RamStudioError(f"unknown demo task(s) {', '.join(unknown) or '(none given)'}.",
                                 f"Choose from {', '.join(suite.tasks)}.")
        self.suite = suite
        self.tasks = chosen

    def splits(self) -> tuple[str, ...]:
        """The splits a sweep may select on and report (the train split is never scored)."""
        return self.suite.splits

    def fingerprint(self) -> str:
        """Backend, suite, tasks, evaluation-set sizes and decoder version, hashed short."""
        sizes = ",".join(f"{s}={len(self.suite.eval_set(t, s, None))}" for t in self.tasks for s in self.splits())
        text = f"demo|{self.suite.name}|{','.join(self.tasks)}|{sizes}|{DECODER_VERSION}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def load(self, folder: Path) -> LoadedModel:
        """Load a demo-compatible folder (safetensors, float32 compute) with transformers; a folder transformers
        cannot load, or whose tokenizer cannot write the demo's prompts for this model, is a RamStudioError."""
        from .modeling import load_checkpoint

        folder = Path(folder)
        with quiet_libraries():
            try:
                module, tokenizer = load_checkpoint(folder)
            except RamStudioError:
                raise
            except Exception as exc:  # noqa: BLE001 — whatever transformers raises, one line for the user
                raise RamStudioError(f"cannot load {folder} as a causal language model: {first_line(exc)}.",
                                     "Give a Hugging Face model folder with safetensors weights and a "
                                     "tokenizer.") from None
        problem = demo_incompatibility(module, tokenizer)
        if problem:
            raise RamStudioError(f"{folder} is not a demo-compatible model: {problem}.",
                                 "The demo tasks need the demo's tokenizer (a demo model or a merge of demo models); "
                                 "score other models on lm-eval tasks with --lm-eval TASKS.")
        return LoadedModel(module=module, tokenizer=tokenizer, source=folder)

    def frame(self, model: LoadedModel, split: str, *, limit: int | None = None,
              progress: EvalProgress | None = None, cancel: threading.Event | None = None) -> pd.DataFrame:
        """The tidy per-task (and per-subset) table: task, subset, n, correct, habit, accuracy (0-1)."""
        from .evaluate import evaluate_loaded

        self._check_split(split)
        return evaluate_loaded(model.module, model.tokenizer, self.tasks, split, limit, self.suite,
                               progress=progress, cancel=cancel)

    def score(self, model: LoadedModel, split: str, *, limit: int | None = None,
              progress: EvalProgress | None = None, cancel: threading.Event | None = None) -> Scores:
        """Score the model as it is in memory now on `split` (accuracy in % per task)."""
        t0 = time.perf_counter()
        df = self.frame(model, split, limit=limit, progress=progress, cancel=cancel)
        return scores_from_frame(df, split, time.perf_counter() - t0)

    def fisher_examples(self, task: str, n: int):
        """The first `n` examples of the task's train split (the agents' RL prompts' split; never a scored
        one), with their reference answers and the task's decoding budget: what a Fisher pass runs on."""
        from evaluation.fisher_pass import FisherData, FisherExample

        if task not in self.suite.tasks:
            raise RamStudioError(f"unknown demo task {task!r} for a Fisher.",
                                 f"Choose from {', '.join(self.suite.tasks)}.")
        budget = self.suite.max_new_tokens[task]
        examples = tuple(FisherExample(e.prompt, e.answer, budget) for e in self.suite.make_split(task, "train", n))
        return FisherData(task, "train", examples, f"demo|{self.suite.name}|{FISHER_DATA}")

    @property
    def fisher_tasks(self) -> tuple[str, ...]:
        """Every task of the suite: a Fisher reads an agent's own task, whichever tasks are scored."""
        return self.suite.tasks

    def fisher_origin(self) -> dict:
        """What a recipe records to build this evaluator's Fisher data again."""
        return {"backend": "demo", "suite": self.suite.name}

    def _check_split(self, split: str) -> None:
        if split not in self.splits():
            raise RamStudioError(f"the demo tasks have no split {split!r}.",
                                 f"Choose one of {', '.join(self.splits())}.")


def demo_incompatibility(module, tokenizer) -> str:
    """Why the demo's prompts cannot be scored on this model ("" when they can): the tokenizer must write every
    printable ASCII character (the tasks' alphabet) and read it back, with ids the model's embedding has, and
    have an end-of-text token to stop at."""
    alphabet = "".join(chr(c) for c in range(32, 127))
    ids = tokenizer(alphabet, add_special_tokens=False)["input_ids"]
    if not ids:
        return "its tokenizer turns the demo's prompts into no tokens (no tokenizer files, or an empty vocabulary)"
    rows = module.get_input_embeddings().weight.shape[0]
    if max(ids) >= rows:
        return f"its tokenizer gives token id {max(ids)}, beyond the model's {rows} embedding rows"
    if tokenizer.decode(ids, skip_special_tokens=True) != alphabet:
        return "its tokenizer does not read the demo's characters back unchanged"
    if tokenizer.eos_token_id is None:
        return "its tokenizer has no end-of-text token"
    return ""


def scores_from_frame(df: pd.DataFrame, split: str, seconds: float) -> Scores:
    """`Scores` (accuracy in %) from a tidy evaluation frame; per-subset accuracies go into `detail` as
    `task@subset`. Standard errors are binomial, √(p(1−p)/n) (tasks and subsets); the per-example outcomes
    come from the frame's `attrs` (evaluate_loaded)."""
    scores: dict[str, float] = {}
    n: dict[str, int] = {}
    detail: dict[str, float] = {}
    stderr: dict[str, float] = {}
    detail_stderr: dict[str, float] = {}
    for rec in df.itertuples():
        se = binomial_se(100.0 * rec.accuracy, int(rec.n))
        if rec.subset == "all":
            scores[rec.task] = 100.0 * rec.accuracy
            n[rec.task] = int(rec.n)
            if se is not None:
                stderr[rec.task] = se
        else:
            detail[f"{rec.task}@{rec.subset}"] = 100.0 * rec.accuracy
            if se is not None:
                detail_stderr[f"{rec.task}@{rec.subset}"] = se
    outcomes = {t: [float(v) for v in vals] for t, vals in df.attrs.get("outcomes", {}).items() if t in scores}
    return Scores(split=split, scores=scores, n=n, seconds=seconds, detail=detail, stderr=stderr,
                  outcomes=outcomes, detail_stderr=detail_stderr)


def measure_on_demo(base: str, agents: list[str], candidates: list, split: str = "validation", *,
                    progress=None, cancel: threading.Event | None = None) -> list:
    """Merge each candidate in memory and score it on the demo tasks of the base's suite (the Tune page's
    settings A and B): evaluation.sweep.measure's entries, in the order given."""
    from evaluation.executors import LocalExecutor
    from evaluation.sweep import SweepSpec, measure
    from merging.reading.refs import resolve

    from .evaluate import suite_of_folder

    spec = SweepSpec(base, list(agents), [], DemoEvaluator(suite=suite_of_folder(resolve(base))))
    return measure(spec, candidates, split, LocalExecutor(), progress=progress, cancel=cancel)

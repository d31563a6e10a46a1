"""What an evaluator is: something that loads a model folder once and scores it, in memory, on named tasks.

Two backends implement it: the demo's built-in tasks (`demo/`) and lm-evaluation-harness
(`evaluation.lm_eval_backend`). A sweep loads the base once through `load`, writes each candidate's
merged weights into that loaded model (`LoadedModel.module`), and calls `score` — no folder written.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol


@dataclass
class LoadedModel:
    """A model held in memory for scoring: the torch module (parameters named as in the safetensors files,
    so a candidate's tensors can be copied in by name), its tokenizer and where it came from."""

    module: Any  # a transformers PreTrainedModel (None for a backend that holds the model itself, e.g. vLLM)
    tokenizer: Any
    source: Path | None = None
    backend: Any = None  # the backend's own object for this model (lm-eval's wrapper, made once; a vLLM engine)


@dataclass
class Scores:
    """One model's scores on one split: accuracy in % per task, examples per task, and extra detail
    (e.g. per-subset accuracies); `seconds` is the scoring time. `stderr`: each task's standard error in points
    (analysis/noise.py); `outcomes`: each task's per-example results in [0, 1], in a fixed example order (their
    mean × 100 is the score), so that two models scored on the same examples can be compared pair by pair;
    `detail_stderr`: standard errors of `detail` entries where known (same units as the entry)."""

    split: str
    scores: dict[str, float]
    n: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    detail: dict[str, float] = field(default_factory=dict)
    stderr: dict[str, float] = field(default_factory=dict)
    outcomes: dict[str, list[float]] = field(default_factory=dict)
    detail_stderr: dict[str, float] = field(default_factory=dict)

    @property
    def average(self) -> float:
        """Mean accuracy (%) over the tasks (unweighted, as in the paper's tables)."""
        return sum(self.scores.values()) / len(self.scores) if self.scores else float("nan")

    @property
    def average_stderr(self) -> float | None:
        """The standard error of `average`: √(Σ se²)/k over the tasks (independent examples per task)."""
        from analysis.noise import average_se

        return average_se(self.stderr.get(t) for t in self.scores) if self.scores else None


# (examples scored so far, examples in all, a line of text)
EvalProgress = Callable[[int, int, str], None]


class Evaluator(Protocol):
    """A scoring backend for a fixed list of tasks."""

    name: str  # "demo" | "lm-eval"
    tasks: tuple[str, ...]

    def splits(self) -> tuple[str, ...]:
        """The splits these tasks can be scored on (a sweep selects on one and reports another)."""

    def fingerprint(self) -> str:
        """A short string identifying the backend, its tasks and settings (part of a sweep's resume key)."""

    def load(self, folder: Path) -> LoadedModel:
        """Load a model folder once (safetensors only; float32 compute)."""

    def score(self, model: LoadedModel, split: str, *, limit: int | None = None,
              progress: EvalProgress | None = None, cancel: threading.Event | None = None) -> Scores:
        """Score the model as it is in memory now on `split` (accuracy in %)."""

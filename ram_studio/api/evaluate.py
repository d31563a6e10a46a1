"""`ram_studio.evaluate`: score one model on the demo's tasks or on lm-evaluation-harness tasks (accuracy in %) —
the CLI's `ram-studio evaluate` as a function (the same evaluators, checks and --json document)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ram_studio.api.display import Shown
from ram_studio.api.options import model_refs, parse
from ram_studio.api.progress import ProgressArg, examples, sink
from ram_studio.api.running import prefetch


def evaluate(model: str | os.PathLike, *, tasks: Sequence[str] | str | None = None, suite: str | None = None,
             lm_eval: Sequence[str] | str | None = None, include_path: str | os.PathLike | None = None,
             backend: str = "auto", device: str = "auto", batch_size: int | str | None = None,
             split: str = "test", limit: int | None = None, json: str | os.PathLike | None = None,
             overwrite: bool = False, progress: ProgressArg = True) -> "Evaluation":
    """Score `model` as `ram-studio evaluate` does (keywords are its flags): the demo's tasks (`tasks`, `suite`)
    or lm-evaluation-harness tasks (`lm_eval`, `include_path`, `backend`, `batch_size`), on `split`, the first
    `limit` examples per task; `json` writes the CLI's document. Returns an Evaluation (scores per task, their
    average, the per-subset frame); bad input raises RamStudioError before anything is loaded."""
    from evaluation.quiet import quiet_libraries
    from merging.common.errors import RamStudioError
    from merging.reading.checkpoint import open_checkpoint
    from ram_studio.commands import evaluate as cli
    from ram_studio.commands.evaluator_options import build_evaluator
    from ram_studio.console import stop_on_signal

    args = parse("evaluate", model_refs(model, "model"),
                 dict(tasks=tasks, suite=suite, lm_eval=lm_eval, include_path=include_path, backend=backend,
                      device=device, batch_size=batch_size, split=split, limit=limit, json=json,
                      overwrite=overwrite))
    if len(args.model if isinstance(args.model, list) else [args.model]) != 1:
        raise RamStudioError("evaluate() scores one model.", "Call it once per model.")
    if args.limit is not None and args.limit < 1:
        raise RamStudioError(f"limit={args.limit} is not a positive number of examples.", "Give limit=1 or more.")
    evaluator = build_evaluator(args)
    if args.split not in evaluator.splits():
        raise RamStudioError(f"the {evaluator.name} tasks {', '.join(evaluator.tasks)} have no {args.split} split "
                             f"to score.", f"Choose split={' or '.join(repr(s) for s in evaluator.splits())}.")
    to = sink(progress)
    with stop_on_signal() as stop:
        prefetch([args.model], to, stop)
    ckpt = open_checkpoint(args.model)
    if args.lm_eval is None and not args.suite:
        evaluator = build_evaluator(args, suite_folder=ckpt.folder)
    out = cli.json_output(args, ckpt)
    if args.lm_eval is None:
        cli.refuse_unless_demo_compatible(ckpt)
    with quiet_libraries():
        frame, scores = cli.score_model(evaluator, evaluator.load(ckpt.folder), args, progress=examples(to))
    doc = cli.json_document(args, ckpt, evaluator, frame, scores)
    if out is not None:
        cli.write_scores_json(out, args, ckpt, evaluator, frame, scores)
    return Evaluation(scores, frame, doc, out)


@dataclass(repr=False)
class Evaluation(Shown):
    """One model's scores on one split: `scores` (accuracy % per task), `average` (unweighted, as the paper's
    tables), `n` (examples per task), `frame` (the demo's per-subset rows; None for lm-eval), `to_json()`."""

    raw: Any  # evaluation.base.Scores
    frame: Any
    document: dict
    file: Path | None = None

    @property
    def model(self) -> str:
        return self.document["model"]

    @property
    def split(self) -> str:
        return self.raw.split

    @property
    def scores(self) -> dict[str, float]:
        return dict(self.raw.scores)

    @property
    def average(self) -> float:
        return self.raw.average

    @property
    def n(self) -> dict[str, int]:
        return dict(self.raw.n)

    @property
    def seconds(self) -> float:
        return self.raw.seconds

    def table(self):
        """Per task: examples and accuracy in % (with its standard error where the evaluator gives one)."""
        import pandas as pd

        rows = [{"task": t, "n": self.raw.n.get(t, 0), "accuracy %": v} for t, v in self.raw.scores.items()]
        stderr = getattr(self.raw, "stderr", None)
        if isinstance(stderr, dict) and stderr:
            for row in rows:
                row["± s.e."] = stderr.get(row["task"])
        return pd.DataFrame(rows)

    def to_json(self) -> dict:
        """The document `ram-studio evaluate --json` writes."""
        import json

        return json.loads(json.dumps(self.document))

    def _title(self) -> str:
        return f"{self.model} · {self.document['evaluator']} · {self.split} split"

    def _facts(self) -> dict[str, Any]:
        facts = {"average": f"{self.average:.2f} %", "time": f"{self.seconds:.1f} s"}
        if self.document.get("limit"):
            facts["limit"] = f"first {self.document['limit']} examples per task"
        return facts

    def _parts(self) -> list[tuple[str, Any]]:
        return [("table", self.table())]

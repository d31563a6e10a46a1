"""The demo evaluator behind `evaluation.base.Evaluator`: same scores as the recorded demo results, its splits,
tasks and progress, and bad input as one clear error."""
from __future__ import annotations

import threading

import pandas as pd
import pytest

from demo.evaluator import DemoEvaluator
from merging.common.errors import Cancelled, RamStudioError
from tests.paths import REPO_ROOT

DEMO = REPO_ROOT / "assets" / "demo"


def test_scores_equal_the_recorded_test_accuracies():
    """The tool agent's test scores equal the row `results/table1.csv` recorded for it."""
    ev = DemoEvaluator()
    scores = ev.score(ev.load(DEMO / "models" / "tool"), "test")
    row = pd.read_csv(DEMO / "results" / "table1.csv").set_index("model").loc["tool"]
    assert scores.split == "test" and scores.n == {"code": 300, "tool": 300, "memory": 300}
    for task in ("code", "tool", "memory"):
        assert round(scores.scores[task], 2) == row[task]
    for length in (32, 64, 128):
        assert round(scores.detail[f"memory@{length}"], 2) == row[f"memory@{length}"]
    assert round(scores.average, 2) == row["avg"]


def test_tasks_splits_progress_and_cancel():
    ev = DemoEvaluator(["code", "memory"])
    model = ev.load(DEMO / "models" / "base")
    seen = []
    scores = ev.score(model, "validation", limit=5, progress=lambda done, total, text: seen.append((done, total)))
    assert list(scores.scores) == ["code", "memory"] and seen == [(5, 10), (10, 10)]
    assert ev.splits() == ("validation", "test")
    assert ev.fingerprint() != DemoEvaluator(["code"]).fingerprint()
    stop = threading.Event()
    stop.set()
    with pytest.raises(Cancelled):
        ev.score(model, "validation", limit=5, cancel=stop)
    with pytest.raises(RamStudioError, match="no split 'train'"):
        ev.score(model, "train", limit=5)
    with pytest.raises(RamStudioError, match="unknown demo task"):
        DemoEvaluator(["code", "poetry"])

"""The committed accuracies are what the demo's evaluator gives today: the tasks' examples (generators, seeds,
splits), their verifiers and the greedy decoder unchanged, for every model of both trios on the test split."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from demo.evaluate import evaluate_model

DEMO = Path(__file__).resolve().parents[2] / "assets" / "demo"
COLUMNS = ["task", "subset", "n", "correct", "habit"]


@pytest.mark.parametrize("trio", ["", "-shared"])
@pytest.mark.parametrize("model", ["base", "code", "tool", "memory"])
def test_the_evaluator_gives_the_committed_counts(trio, model):
    committed = pd.read_csv(DEMO / f"results{trio}" / "accuracy.csv", dtype={"subset": str})
    want = committed[(committed["model"] == model) & (committed["split"] == "test")]
    columns = COLUMNS + (["format_slip"] if "format_slip" in committed.columns else [])
    got = evaluate_model(DEMO / f"models{trio}" / model, split="test")  # the suite its config.json names
    assert len(want) == len(got) > 3  # every task, and memory by context length
    pd.testing.assert_frame_equal(got[columns].reset_index(drop=True), want[columns].reset_index(drop=True),
                                  check_dtype=False)

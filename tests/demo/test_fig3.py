"""The demo's Fig. 3 experiment: its rows in the CLI's order, shared with the app, and its time estimate."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.paths import REPO_ROOT

DEMO = REPO_ROOT / "assets" / "demo" / "models"
DEMO_REFS = [str(DEMO / "base")] + [str(DEMO / a) for a in ("code", "tool", "memory")]


def test_fig3_experiment_rows_in_the_cli_order(monkeypatch, tmp_path):
    """run_experiment (shared by `python -m demo.fig3` and the app): references on every split first,
    then per agent the whole and the ÷ N merge on every split; the merges are real unique_only merges."""
    if not (DEMO / "base").is_dir():
        pytest.skip("the demo models are not built")
    from demo import evaluate, fig3
    from merging.recipe import read_recipe

    seen = []

    def scored(folder, tasks, split="test", limit=None):
        recipe = Path(folder) / "ram_recipe.json"
        spec = read_recipe(Path(folder))[0] if recipe.exists() else None
        seen.append((None if spec is None else (spec.params["agent"], spec.params["dilute"]), tuple(tasks), split))
        return pd.DataFrame({"task": list(tasks), "subset": "all", "n": 10, "correct": 5, "accuracy": 0.5})

    monkeypatch.setattr(evaluate, "evaluate_model", scored)
    steps = []
    tidy = fig3.run_experiment(DEMO_REFS[0], DEMO_REFS[1:3], splits=("validation", "test"),
                               step=lambda f, t: steps.append((f, t)))
    assert list(tidy.columns) == fig3.COLUMNS
    order = list(zip(tidy["variant"], tidy["agent"], tidy["split"]))
    assert order[:3] == [("base", "", "validation")] * 3  # the base on every task
    assert order[3:5] == [("agent", "code", "validation"), ("agent", "tool", "validation")]
    assert order[10:14] == [("unique", "code", "validation"), ("unique", "code", "test"),
                            ("unique_div_N", "code", "validation"), ("unique_div_N", "code", "test")]
    merged = [s for s in seen if s[0] is not None]
    assert [m[0] for m in merged[::2]] == [("0", False), ("0", True), ("1", False), ("1", True)]
    assert steps[-1] == (1.0, "14 steps done") and all(b[0] >= a[0] for a, b in zip(steps, steps[1:]))
    app_rows = fig3.percent_rows(tidy)
    assert list(app_rows.columns) == fig3.PERCENT_COLUMNS and (app_rows["accuracy"] == 50.0).all()

    acc = tmp_path / "accuracy.csv"
    acc.write_text("model,split,task,subset,n,correct,accuracy\nbase,test,code,all,10,3,0.3\n"
                   "code,test,code,all,10,9,0.9\n")
    refs = fig3.reference_rows(acc, ["code"], {"code": ["code"]})
    assert list(zip(refs["variant"], refs["agent"])) == [("base", ""), ("agent", "code")]
    assert fig3.reference_rows(acc, ["code", "tool"], {"code": ["code"], "tool": ["tool"]}) is None


def test_fig3_estimate_grows_with_the_model():
    from demo.fig3 import estimate_seconds

    demo = estimate_seconds(3, 328_512, 660_944, [300, 300, 300])
    assert 3 < demo < 60  # the demo's job took 12 s here
    bigger = estimate_seconds(3, 500_000_000, 1_000_000_000, [300, 300, 300])
    assert bigger > 100 * demo
    assert estimate_seconds(3, 328_512, 660_944, [300, 300, 300], 1200) > demo  # base and agents scored too

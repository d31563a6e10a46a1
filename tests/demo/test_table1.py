"""The demo's mini Table 1 is a sweep definition. Run through the sweep code on two of the merges it chose (task
arithmetic and RAM), it reproduces the committed results: their validation scores (rows of
results/table1_validation_search.csv), their test rows of results/table1.csv and their paired comparison in
results/table1_comparisons.csv, to the byte. The committed search's choices are checked against its own
validation scores.

The whole search (111 validation candidates, 8 merges and 4 references on test, three Fisher passes) takes too long
for every CI run. To reproduce all of it, run `python -m demo.table1 --out DIR` and compare DIR with
assets/demo/results (the files are byte-identical)."""
from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest

from demo import table1
from demo.evaluate import suite_of_folder
from demo.evaluator import DemoEvaluator
from evaluation.executors import EXECUTORS
from evaluation.grid import grids_from_yaml
from evaluation.store import ScoreStore
from evaluation.sweep import SweepSpec, run_sweep

RESULTS = table1.DEMO_DIR / "results"
MODELS = table1.DEMO_DIR / "models"
CHECKED = ("task_arithmetic", "ram")  # re-scored: the paper's method and the baseline it is most compared with
# which choice the whole search made depends on every other candidate: a one-value grid cannot judge it
DEPENDS_ON_THE_WHOLE_GRID = ("grid_edge", "within_noise", "within_noise_of_chosen")

pytestmark = pytest.mark.timeout(900)  # 4 scorings of 900 examples on a CPU


def chosen_grids(table: pd.DataFrame) -> str:
    """A grid file with one candidate for each CHECKED method: the settings the committed table chose."""
    lines = ["grids:"]
    for model, params in zip(table["model"], table["params"]):
        if model not in CHECKED:
            continue
        lines.append(f"  - method: {model}")
        for pair in params.split():
            key, value = pair.split("=", 1)
            lines.append(f"    {key}: [{value}]")
    return "\n".join(lines) + "\n"


def read(text: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)


def test_the_chosen_merges_reproduce_the_committed_table(tmp_path: Path):
    committed = read((RESULTS / "table1.csv").read_text())
    spec = SweepSpec(str(MODELS / "base"), [str(MODELS / a) for a in table1.AGENTS],
                     grids_from_yaml(chosen_grids(committed)),
                     DemoEvaluator(suite=suite_of_folder(MODELS / "base")), references=False)
    res = run_sweep(spec, EXECUTORS["local"](), store=ScoreStore(tmp_path / "store"))
    assert len(res.candidates("validation")) == len(CHECKED) == len(res.candidates("test"))
    table1.save(*table1.tables(res), tmp_path / "out", "demo", table1.comparisons(res), res.notes)

    ours = read((tmp_path / "out" / "table1.csv").read_text())
    keep = [c for c in committed.columns if c not in DEPENDS_ON_THE_WHOLE_GRID]
    expected = committed[committed["model"].isin(CHECKED)][keep].reset_index(drop=True)
    pd.testing.assert_frame_equal(ours[keep].reset_index(drop=True), expected)

    pairs = (tmp_path / "out" / "table1_comparisons.csv").read_text().splitlines()
    committed_pairs = (RESULTS / "table1_comparisons.csv").read_text().splitlines()
    assert pairs[0] == committed_pairs[0] and len(pairs) == 2 and pairs[1] in committed_pairs, pairs

    search = read((RESULTS / "table1_validation_search.csv").read_text())
    trials = read((tmp_path / "out" / "table1_validation_search.csv").read_text())
    keep = [c for c in trials.columns if c not in DEPENDS_ON_THE_WHOLE_GRID]  # the grids' parameters, the scores
    committed_rows = {tuple(r) for r in search[keep].itertuples(index=False)}
    missing = [tuple(r) for r in trials[keep].itertuples(index=False) if tuple(r) not in committed_rows]
    assert not missing, f"validation scores that differ from the committed search: {missing}"


def test_the_committed_search_chose_each_methods_best_on_validation():
    """The committed table's settings are, for each method, the best validation average of the committed search
    (ties to the first listed, as the sweep breaks them)."""
    table = read((RESULTS / "table1.csv").read_text())
    search = pd.read_csv(RESULTS / "table1_validation_search.csv", keep_default_na=False)
    assert len(search) == 111
    for method, group in search.groupby("method", sort=False):
        best = group.loc[group["val_avg"].idxmax()]
        chosen = table.loc[table["model"] == method].iloc[0]
        assert best["params"] == chosen["params"], method
        assert float(best["val_avg"]) == float(chosen["val_avg"]), method

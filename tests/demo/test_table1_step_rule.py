"""The mini Table 1 with the step rule (demo/table1_step_rule.py): its grid is Table 1's for every other
method; on a small real sweep (demo models and evaluator, 8 examples per task and split) its files carry every
score with its standard error, RAM / RAM+ under the paper's ε next to the rule validation chose (scored on the same
test examples), and the paired differences recomputed here by brute force (numpy) from the per-example outcomes."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from demo import table1
from demo import table1_step_rule as step
from evaluation.grid import read_grid_file
from evaluation.store import ScoreStore

pytestmark = pytest.mark.timeout(1200)

SMALL = """grids:
  - method: task_arithmetic
    lambda: [0.5, 1.0]
  - method: ram
    eps: 1.0e-5
    eps_steps: [0, 1]
  - method: ram_plus
    eps: 1.0e-5
    r: 0.1
    alpha: 2.0
    eps_steps: [0, 1]
"""


def test_the_other_methods_are_searched_as_in_table1():
    """Every grid but RAM / RAM+ (and Fisher, left to Table 1) is Table 1's, so those rows are Table 1's."""
    mine = read_grid_file(step.GRIDS)
    theirs = read_grid_file(table1.GRIDS)
    assert [g for g in mine if g.method not in step.RULED] == [
        g for g in theirs if g.method not in (*step.RULED, "fisher")]
    for g in (g for g in mine if g.method in step.RULED):
        axes = dict(g.axes)
        assert axes["eps"] == (1e-5,) and 0.0 in axes["eps_steps"] and len(axes["eps_steps"]) > 1


def _brute(a, b, tasks) -> tuple[float, float]:
    """a − b on the task average and √(Σ se_t²)/k with se_t = sd(d)/√n, from the outcomes."""
    ds = [np.asarray(a.outcomes[t]) - np.asarray(b.outcomes[t]) for t in tasks]
    return (float(np.mean([100 * d.mean() for d in ds])),
            math.sqrt(sum((100 * d.std() / math.sqrt(len(d))) ** 2 for d in ds)) / len(ds))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("step-rule")
    (tmp / "grids.yaml").write_text(SMALL)
    mp = pytest.MonkeyPatch()
    mp.setattr(step, "GRIDS", tmp / "grids.yaml")
    try:
        store = ScoreStore(tmp / "store")
        res = step.sweep(step.DEMO_DIR / "models", limit=8, store=store)
        paper = step.paper_rule(res, store=store)
        step.write(res, paper, tmp / "out", "demo")
    finally:
        mp.undo()
    return res, paper, tmp / "out"


def test_the_files_have_every_score_with_its_standard_error(written):
    res, paper, out = written
    table = pd.read_csv(out / "table1_step_rule.csv")
    for c in ("code", "tool", "memory", "avg"):
        assert table[f"{c}_se"].notna().all() and (table[f"{c}_se"] > 0).any()
    md = (out / "table1_step_rule.md").read_text()
    assert md.startswith("Mini Table 1 with the step rule in RAM / RAM+'s grid (demo, test split, accuracy % ± one")
    body = [line for line in md.split("Standard errors:")[0].splitlines()
            if line.startswith("| ") and not line.startswith("| model")]
    assert body and all(" ± " in cell for line in body for cell in line.strip("|").split("|")[1:])
    for m in step.RULED:
        rules = [line for line in md.splitlines() if line.startswith(f"- {m} eps=1e-05 ") and "eps_steps=" in line]
        assert len(rules) == 2 and sum(line.endswith(" *") for line in rules) == 1
    assert {"table1_step_rule_comparisons.csv", "table1_step_rule_validation_search.csv"} <= {
        p.name for p in out.iterdir()}


def test_the_paper_rule_is_scored_on_the_same_test_examples(written):
    res, paper, out = written
    table = pd.read_csv(out / "table1_step_rule.csv").set_index("model")
    pairs = pd.read_csv(out / "table1_step_rule_comparisons.csv")
    chosen = {e.method: e for e in res.candidates("test") if e.selected}
    ta = chosen["task_arithmetic"]
    tasks = list(ta.scores)
    assert set(paper) == set(step.RULED)
    for m, e in paper.items():
        assert e.split == "test" and e.params["eps_steps"] == 0.0 and e.params["eps"] == pytest.approx(1e-5)
        own = chosen[m] is e
        name = m if own else step.PAPER.format(m)
        assert name in table.index and table.loc[name, "avg"] == pytest.approx(round(e.average, 2))
        assert (step.PAPER.format(m) in table.index) == (not own) == (chosen[m].params["eps_steps"] != 0.0)
        # where validation chose the paper's ε, its pairs are the sweep's own comparisons
        checks = [] if own else [((name, "task_arithmetic"), e, ta), ((m, name), chosen[m], e)]
        for (a, b), ea, eb in checks:
            (r,) = pairs[(pairs.a == a) & (pairs.b == b)].itertuples()
            diff, se = _brute(ea, eb, tasks)
            assert r.paired and r.diff == pytest.approx(round(diff, 2)) and r.stderr == pytest.approx(round(se, 2))
            assert r.beyond_noise == (abs(diff) > 2 * se)
    # the sweep's own comparisons (chosen against chosen) follow the step rule's
    assert len(pairs) == len(step.rule_pairs(res, paper)) + len(res.comparisons)


def test_the_reading_quotes_the_files_and_the_noise(written, tmp_path):
    """The one-paragraph reading (the app's Signal dilution page shows it) quotes each score ± s.e. and each paired
    difference from the files, and says "beats" or "trails" only beyond two standard errors."""
    res, paper, out = written
    text = step.reading(out)
    clauses = [c for part in text.split(". ") for c in part.split("; ")]
    table = pd.read_csv(out / "table1_step_rule.csv").set_index("model")
    pairs = pd.read_csv(out / "table1_step_rule_comparisons.csv")
    for m in step.RULED:
        assert f"{table.loc[m, 'avg']:.2f} ± {table.loc[m, 'avg_se']:.2f}" in text
        k = float(table.loc[m, "params"].split("eps_steps=")[1])
        assert f"{step.SHOWN[m]}: validation chose eps_steps = {k:g}" in text
        judged = pairs[((pairs.a == m) & pairs.b.isin([step.PAPER.format(m), "task_arithmetic"]))
                       | ((pairs.a == "task_arithmetic") & (pairs.b == m))]
        assert len(judged) == (2 if step.PAPER.format(m) in table.index else 1)
        for r in judged.itertuples():
            diff = r.diff if r.a == m else -r.diff
            said = [c for c in clauses if c.startswith(step.SHOWN[m]) and (
                f"{abs(diff):.2f} ± {r.stderr:.2f} points" in c or f"{diff:+.2f} ± {r.stderr:.2f} points" in c)]
            assert len(said) >= 1, (r.a, r.b, text)
            assert ("within noise" not in said[0]) == bool(r.beyond_noise), said[0]
            assert (("beats" in said[0]) == (r.beyond_noise and diff > 0)
                    and ("trails" in said[0]) == (r.beyond_noise and diff < 0)), said[0]
    assert step.reading(tmp_path) is None  # no files, no reading

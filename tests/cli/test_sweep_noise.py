"""`ram-studio sweep --json` on the demo models with the real evaluator: every standard error, every paired
comparison, every within-noise mark and every grid edge recomputed by brute force (numpy) from the per-example
outcomes the JSON carries, and the terminal saying the same."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from ram_studio.cli import main

DEMO = ["demo:base", "demo:code", "demo:tool", "demo:memory"]
GRIDS = ["task_arithmetic lambda=0.5,1.0", "ties lambda=0.5,1.0 density=0.1,0.2",
         "dare_ta lambda=@task_arithmetic drop_rate=0.1,0.3", "ram"]
TASKS = ["code", "memory"]
LIMIT = 16

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One real sweep (demo evaluator, 16 examples per task and split): its JSON document and terminal output."""
    import contextlib
    import io
    import os

    tmp = tmp_path_factory.mktemp("sweep")
    os.environ["RAM_STUDIO_SWEEP_CACHE"] = str(tmp / "store")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            code = main(["sweep", *DEMO, *[a for g in GRIDS for a in ("--try", g)], "--tasks", ",".join(TASKS),
                         "--limit", str(LIMIT), "--json", str(tmp / "s.json"), "--quiet"])
    finally:
        os.environ.pop("RAM_STUDIO_SWEEP_CACHE", None)
    assert code == 0
    return json.loads((tmp / "s.json").read_text()), out.getvalue()


def outcomes(entry: dict) -> dict[str, np.ndarray]:
    return {t: np.array([int(c) for c in s], dtype=float) for t, s in entry["outcomes"].items()}


def paired(a: dict, b: dict) -> tuple[float, float]:
    """Brute force: the mean over tasks of the per-example differences, √(Σ se_t²)/k with se_t = sd(d)/√n."""
    oa, ob = outcomes(a), outcomes(b)
    ds = [oa[t] - ob[t] for t in TASKS]
    diff = float(np.mean([100 * d.mean() for d in ds]))
    se = math.sqrt(sum((100 * d.std(ddof=0) / math.sqrt(len(d))) ** 2 for d in ds)) / len(ds)
    return diff, se


def test_every_score_has_its_binomial_standard_error(swept):
    doc, _ = swept
    for e in doc["candidates"] + doc["references"]:
        o = outcomes(e)
        assert set(o) == set(TASKS) and set(e["stderr"]) == {*TASKS, "average"}
        for t in TASKS:
            p, n = o[t].mean(), len(o[t])
            assert n == e["n"][t] == LIMIT
            assert e["scores"][t] == pytest.approx(100 * p, abs=1e-9)
            assert e["stderr"][t] == pytest.approx(100 * math.sqrt(p * (1 - p) / n), abs=1e-9)
        assert e["stderr"]["average"] == pytest.approx(
            math.sqrt(sum(e["stderr"][t] ** 2 for t in TASKS)) / len(TASKS), abs=1e-9)
        if "id" in e:
            assert e["id"] == e["candidate"]


def test_comparisons_are_every_pair_of_chosen_candidates_paired_per_example(swept):
    doc, _ = swept
    test = {e["id"]: e for e in doc["candidates"] if e["split"] == "test"}
    chosen = [e["id"] for e in doc["candidates"] if e["split"] == "test"]
    assert set(chosen) == set(doc["selected"].values()) and len(chosen) == 4
    assert [(c["a"], c["b"]) for c in doc["comparisons"]] == list(itertools.combinations(chosen, 2))
    for c in doc["comparisons"]:
        assert c["split"] == "test" and c["paired"] is True
        diff, se = paired(test[c["a"]], test[c["b"]])
        assert c["diff"] == pytest.approx(diff, abs=1e-9) and c["stderr"] == pytest.approx(se, abs=1e-9)
        assert c["diff"] == pytest.approx(test[c["a"]]["average"] - test[c["b"]]["average"], abs=1e-9)
        assert c["beyond_noise"] == (abs(diff) > 2 * se)
        for t in TASKS:
            d = outcomes(test[c["a"]])[t] - outcomes(test[c["b"]])[t]
            assert c["tasks"][t]["stderr"] == pytest.approx(100 * d.std() / math.sqrt(len(d)), abs=1e-9)


def test_within_noise_marks_what_validation_cannot_tell_from_the_best(swept):
    doc, _ = swept
    valid = [e for e in doc["candidates"] if e["split"] == "validation"]
    (best,) = [e for e in valid if e["best"]]
    assert all(isinstance(e["within_noise"], bool) for e in valid)
    for e in valid:
        diff, se = paired(best, e)
        assert e["within_noise"] == (diff <= 2 * se), e["id"]
        chosen = next(c for c in valid if c["id"] == doc["selected"][e["method"]])
        d2, se2 = paired(chosen, e)
        assert e["within_noise_of_chosen"] == (d2 <= 2 * se2), e["id"]
    assert best["within_noise"] is True
    assert {e["within_noise"] for e in valid} == {True, False}  # this data tells some candidates apart, not all
    assert not any("within_noise" in e for e in doc["candidates"] if e["split"] == "test")


def test_grid_edges_are_the_chosen_values_at_the_end_of_what_was_tried(swept):
    doc, out = swept
    valid = [e for e in doc["candidates"] if e["split"] == "validation"]
    for e in doc["candidates"]:
        if not e["selected"]:
            assert "grid_edge" not in e
            continue
        tried = [v for v in valid if v["method"] == e["method"]]
        given = [w.split("=")[0] for w in e["candidate"].split()[1:]]  # the parameters the grid set
        want = []
        for name in given:
            values = sorted({v["params"][name] for v in tried})
            if len(values) >= 2 and e["params"][name] in (values[0], values[-1]):
                want.append(name)
        assert sorted(e["grid_edge"]) == sorted(want), e["id"]
        for name, nxt in e["grid_edge_next"].items():
            top = e["params"][name] == max(v["params"][name] for v in tried)
            assert nxt and all((x > e["params"][name]) == top for x in nxt)
            assert f"{name}={e['params'][name]:g} is the {'largest' if top else 'smallest'} value tried" in out
    # the grids here stop at λ = 1.0 and the demo's validation score still rises there: the sweep says so
    ta = next(e for e in valid if e["id"] == doc["selected"]["task_arithmetic"])
    if ta["params"]["lambda"] == 1.0:
        assert ta["grid_edge"] == ["lambda"] and ta["grid_edge_next"]["lambda"] == [1.5, 2.0]
        assert "task_arithmetic: the chosen lambda=1 is the largest value tried (try lambda=1.5,2)" in out


def test_the_terminal_shows_the_noise(swept):
    doc, out = swept
    assert "accuracy % ± standard error" in out and "~ within noise of the best" in out
    assert "chosen against chosen" in out
    for c in doc["comparisons"]:
        assert f"{c['diff']:+.2f} ± {c['stderr']:.2f}" in out
    best = next(e for e in doc["candidates"] if e["best"] and e["split"] == "validation")
    assert f"{best['average']:6.2f} ±{best['stderr']['average']:5.2f}" in out

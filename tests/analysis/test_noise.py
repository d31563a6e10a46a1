"""The noise maths (analysis/noise.py) against numpy brute force on random outcomes: binomial standard errors, the
standard error of an average over tasks, paired differences, the two-standard-error rule, and the compact
outcome format."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import noise


def _brute_paired(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    d = a - b
    return 100 * d.mean(), 100 * d.std(ddof=0) / math.sqrt(len(d))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.integers(0, 2 ** 32 - 1))
def test_binomial_se_is_the_sd_of_the_outcomes_over_root_n(n, seed):
    x = np.random.default_rng(seed).integers(0, 2, n).astype(float)
    p = x.mean()
    want = 100 * math.sqrt(p * (1 - p) / n)
    assert noise.binomial_se(100 * p, n) == pytest.approx(want, abs=1e-12)
    assert noise.outcome_se(list(x)) == pytest.approx(100 * x.std(ddof=0) / math.sqrt(n), abs=1e-12)
    assert noise.outcome_se(list(x)) == pytest.approx(want, abs=1e-12)


def test_binomial_se_refuses_what_is_not_a_share():
    assert noise.binomial_se(50.0, 0) is None and noise.binomial_se(120.0, 10) is None
    assert noise.binomial_se(float("nan"), 10) is None
    assert noise.binomial_se(50.0, 300) == pytest.approx(100 * math.sqrt(0.25 / 300))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 20.0), min_size=1, max_size=8))
def test_average_se_is_root_sum_of_squares_over_k(ses):
    want = math.sqrt(np.sum(np.square(ses))) / len(ses)
    assert noise.average_se(ses) == pytest.approx(want, rel=1e-12)
    assert noise.average_se([*ses[:-1], None]) is None


def test_average_se_matches_a_simulation_of_independent_tasks():
    rng = np.random.default_rng(0)
    ps, n = [0.2, 0.5, 0.7], 300
    sims = np.mean([rng.binomial(n, p, 40_000) / n * 100 for p in ps], axis=0)
    se = noise.average_se(noise.binomial_se(100 * p, n) for p in ps)
    assert sims.std() == pytest.approx(se, rel=0.02)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 300), st.integers(0, 2 ** 32 - 1), st.floats(0.0, 1.0))
def test_paired_difference_and_its_se(n, seed, tie):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2, n).astype(float)
    b = np.where(rng.random(n) < tie, a, rng.integers(0, 2, n)).astype(float)  # b copies a on a share of examples
    diff, se = noise.paired_task(list(a), list(b))
    want = _brute_paired(a, b)
    assert diff == pytest.approx(want[0], abs=1e-9) and se == pytest.approx(want[1], abs=1e-9)
    # against a model that gets everything wrong, the paired s.e. is the binomial one
    assert noise.paired_task(list(a), [0.0] * n)[1] == pytest.approx(noise.binomial_se(100 * a.mean(), n), abs=1e-9)


def test_paired_over_tasks_and_what_pairing_buys():
    rng = np.random.default_rng(1)
    hard = rng.random(300) < 0.5  # examples both models find hard: shared noise
    a = {t: list((~hard & (rng.random(300) < 0.9)).astype(float)) for t in ("x", "y")}
    b = {t: list((~hard & (rng.random(300) < 0.8)).astype(float)) for t in ("x", "y")}
    diff, se, per = noise.paired(a, b, ["x", "y"])
    brute = {t: _brute_paired(np.array(a[t]), np.array(b[t])) for t in ("x", "y")}
    assert diff == pytest.approx(np.mean([v[0] for v in brute.values()]))
    assert se == pytest.approx(math.sqrt(sum(v[1] ** 2 for v in brute.values())) / 2)
    assert per["x"] == pytest.approx(brute["x"])
    unpaired = noise.unpaired_se(noise.average_se(noise.outcome_se(a[t]) for t in a),
                                 noise.average_se(noise.outcome_se(b[t]) for t in b))
    assert se < unpaired  # the shared hard examples cancel in the pairs
    assert noise.paired(a, {"x": b["x"]}, ["x", "y"]) is None  # not the same examples: no paired comparison
    assert noise.paired(a, {"x": b["x"][:10], "y": b["y"]}, ["x", "y"]) is None


def test_two_standard_errors_decide_a_claim():
    assert noise.beyond_noise(2.1, 1.0) and noise.beyond_noise(-2.1, 1.0)
    assert not noise.beyond_noise(2.0, 1.0) and not noise.beyond_noise(5.0, None)
    assert noise.compare_text("A", "B", 3.0, 1.0) == "A beats B by 3.0 ± 1.0 points"
    assert noise.compare_text("A", "B", -3.0, 1.0) == "A trails B by 3.0 ± 1.0 points"
    assert noise.compare_text("A", "B", 1.5, 1.0) == "A and B are within noise (+1.5 ± 1.0 points)"
    assert "not judged" in noise.compare_text("A", "B", 1.5, None)
    assert noise.plus_minus(33.217, 1.44) == "33.2 ± 1.4" and noise.plus_minus(float("nan"), 1.0) == "–"


def test_outcomes_pack_compactly_and_come_back():
    out = {"code": [1.0, 0.0, 1.0], "f1": [0.5, 0.25], "none": []}
    packed = noise.pack_outcomes(out)
    assert packed == {"code": "101", "f1": [0.5, 0.25], "none": ""}
    assert noise.unpack_outcomes(packed) == out
    # malformed stored values are dropped, never trusted
    assert noise.unpack_outcomes({"a": "10x1", "b": [1, "x"], "c": [float("inf")], "d": 3, "e": "01"}) == \
        {"e": [0.0, 1.0]}
    assert noise.unpack_outcomes(["not", "a", "dict"]) == {}

"""How much a score can be trusted: standard errors of accuracies, of averages over tasks, and of the paired
difference of two models scored on the same examples — and when a difference is larger than its noise.

All in percentage points (the units of `Scores.scores`):
- one task: the binomial standard error √(p(1−p)/n) of an accuracy p on n examples (per-example outcomes in
  [0, 1]: their population standard deviation / √n, which is the same number for 0/1 outcomes);
- an unweighted average over k tasks scored on independent examples: √(Σ se_t²) / k;
- two models on the same examples: the per-example differences d_i = a_i − b_i, their mean and its standard
  error sd(d) / √n (population sd, so that against a model that gets everything wrong it is the binomial s.e.);
  over tasks, the mean of the per-task differences with √(Σ se_t²) / k. Pairing removes the part of the noise
  both models share (the same hard examples), so a paired s.e. is usually well below √(se_a² + se_b²).
A difference is said to be real ("A beats B") only when it exceeds Z = 2 standard errors; within that, the two
are within noise of each other.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

Z = 2.0  # standard errors a difference must exceed before one score is said to beat another
MAX_OUTCOMES = 10_000_000  # per task: bounded when read back from a stored result


def binomial_se(pct: float, n: int) -> float | None:
    """√(p(1−p)/n) in points for an accuracy of `pct` % on n examples; None when n is 0 or p is not a share."""
    if not n or n <= 0 or pct is None or not math.isfinite(pct) or not 0.0 <= pct <= 100.0:
        return None
    p = pct / 100.0
    return 100.0 * math.sqrt(p * (1.0 - p) / n)


def outcome_se(values: Sequence[float]) -> float | None:
    """The standard error (points) of the mean of per-example outcomes in [0, 1]: population sd / √n."""
    n = len(values)
    if n == 0:
        return None
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    return 100.0 * math.sqrt(var / n)


def average_se(ses: Iterable[float | None]) -> float | None:
    """√(Σ se²)/k: the standard error of an unweighted mean of k scores with independent errors (None when any
    is unknown)."""
    ses = list(ses)
    if not ses or any(s is None or not math.isfinite(s) for s in ses):
        return None
    return math.sqrt(sum(s * s for s in ses)) / len(ses)


def paired_task(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """(mean of a − b in points, its standard error) for two models' outcomes on the same examples in the same
    order; None when the lists differ in length or are empty (not the same examples)."""
    n = len(a)
    if n == 0 or len(b) != n:
        return None
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / n
    var = sum((v - mean) ** 2 for v in d) / n
    return 100.0 * mean, 100.0 * math.sqrt(var / n)


def paired(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]],
           tasks: Sequence[str]) -> tuple[float, float, dict[str, tuple[float, float]]] | None:
    """The paired difference a − b of the unweighted task average, its standard error, and per task (diff, se);
    None unless both have outcomes on the same examples for every task."""
    per: dict[str, tuple[float, float]] = {}
    for t in tasks:
        got = paired_task(a.get(t) or [], b.get(t) or [])
        if got is None:
            return None
        per[t] = got
    if not per:
        return None
    diff = sum(d for d, _ in per.values()) / len(per)
    return diff, average_se(se for _, se in per.values()), per


def unpaired_se(se_a: float | None, se_b: float | None) -> float | None:
    """√(se_a² + se_b²): the standard error of a difference of scores on independent examples (an upper bound
    for the same examples, used only where per-example outcomes are not kept)."""
    if se_a is None or se_b is None:
        return None
    return math.sqrt(se_a * se_a + se_b * se_b)


def beyond_noise(diff: float, se: float | None) -> bool:
    """Whether |diff| exceeds Z standard errors (an unknown s.e. never supports a claim)."""
    return se is not None and math.isfinite(diff) and abs(diff) > Z * se


def plus_minus(value: float | None, se: float | None, digits: int = 1, signed: bool = False) -> str:
    """`33.2 ± 1.4` (`+1.6 ± 1.0` when `signed`; just the value when the s.e. is unknown; `–` for no value)."""
    if value is None or not math.isfinite(value):
        return "–"
    return (f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}") + (
        "" if se is None or not math.isfinite(se) else f" ± {se:.{digits}f}")


def compare_text(a: str, b: str, diff: float, se: float | None, digits: int = 1) -> str:
    """`A beats B by 2.1 ± 0.8 points` / `A trails B by …` only beyond Z s.e.; otherwise `A and B are within
    noise (−0.4 ± 0.9 points)`."""
    err = "" if se is None else f" ± {se:.{digits}f}"
    if se is None:
        return f"{a} − {b} = {diff:+.{digits}f} points (no standard error: not judged)"
    if beyond_noise(diff, se):
        return f"{a} {'beats' if diff > 0 else 'trails'} {b} by {abs(diff):.{digits}f}{err} points"
    return f"{a} and {b} are within noise ({diff:+.{digits}f}{err} points)"


# ---------------------------------------------------------------- per-example outcomes, stored compactly

def pack_outcomes(outcomes: Mapping[str, Sequence[float]]) -> dict[str, str | list[float]]:
    """Per task: a string of '0'/'1' when every outcome is 0 or 1 (one character per example), else the list."""
    out: dict[str, str | list[float]] = {}
    for task, values in outcomes.items():
        vals = [float(v) for v in values]
        out[task] = "".join("1" if v == 1.0 else "0" for v in vals) if all(v in (0.0, 1.0) for v in vals) else vals
    return out


def unpack_outcomes(packed: object) -> dict[str, list[float]]:
    """Back from `pack_outcomes` (anything malformed: no outcomes for that task)."""
    out: dict[str, list[float]] = {}
    if not isinstance(packed, dict):
        return out
    for task, values in packed.items():
        if isinstance(values, str) and len(values) <= MAX_OUTCOMES and set(values) <= {"0", "1"}:
            out[str(task)] = [1.0 if c == "1" else 0.0 for c in values]
        elif isinstance(values, list) and len(values) <= MAX_OUTCOMES and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            out[str(task)] = [float(v) for v in values]
    return out

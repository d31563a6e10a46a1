"""Method parameters, declared once: the declaration builds the CLI flags, validates recipe values and
lays out the app's form.

The parameters several methods share (ε, λ, …) are declared here; a method's own ones live in its file.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from merging.common.errors import RamStudioError

KINDS = (float, int, str, bool)


@dataclass(frozen=True)
class Param:
    """One parameter: name, type, default, allowed range or choices, help, and how it is used.

    `low`/`high` bound numbers (`*_open` makes a bound exclusive); `choices` lists allowed strings;
    `float32` says the value enters the float32 maths as is, so it must stay finite in float32;
    `step` is the app's increment; `required` parameters have no default and must be given; `label` is what
    every form shows (the app's Merge form and Tune alike).
    """

    name: str
    kind: type
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] | None = None
    float32: bool = False
    step: float | None = None
    required: bool = False
    label: str = ""  # what forms show (the paper's symbol and a few words); the name when empty

    @property
    def title(self) -> str:
        """The parameter as forms label it: its declared label, else its name."""
        return self.label or self.name

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TypeError(f"parameter {self.name}: kind must be one of {KINDS}")
        # A declaration error shows when the method file is imported, not as a traceback in a user's merge.
        if not isinstance(self.help, str) or not isinstance(self.label, str):
            raise TypeError(f"parameter {self.name}: help and label are text (write low=, high=, label= as keywords)")
        for bound in (self.low, self.high, self.step):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))):
                raise TypeError(f"parameter {self.name}: low, high and step are numbers or None")

    @property
    def flag(self) -> str:
        """The CLI flag: --name with dashes (e.g. --drop-rate)."""
        return "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        """The argparse attribute (a Python keyword like `lambda` gets a trailing underscore)."""
        return self.name + "_" if self.name in ("lambda",) else self.name

    def range_text(self) -> str:
        """The allowed values in words, for help texts and errors."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.low is None and self.high is None:
            return f"a {self.kind.__name__}"
        lo = "" if self.low is None else f"{'(' if self.low_open else '['}{self.low:g}"
        hi = "" if self.high is None else f"{self.high:g}{')' if self.high_open else ']'}"
        if self.low is not None and self.high is not None:
            return f"in {lo}, {hi}"
        return f"{'>' if self.low_open else '≥'} {self.low:g}" if self.low is not None else (
            f"{'<' if self.high_open else '≤'} {self.high:g}")

    def coerce(self, value: Any, *, strict: bool) -> Any:
        """Turn a given value into the declared type. `strict` (recipes, YAML) accepts only JSON values
        of the right type (an int for a float is fine); otherwise text from a form or flag is parsed."""
        if self.kind is bool:
            return _boolean(value, strict)
        if isinstance(value, bool) or (strict and self.kind in (float, int) and not isinstance(value, (int, float))):
            raise ValueError(value)
        if strict and self.kind is str and not isinstance(value, str):
            raise ValueError(value)
        if self.kind is int and isinstance(value, float):
            if not value.is_integer():
                raise ValueError(value)
            value = int(value)
        return self.kind(value)

    def problem(self, value: Any) -> str | None:
        """Why `value` (already of the declared type) is not allowed, or None."""
        if self.choices is not None and value not in self.choices:
            return f"must be {self.range_text()}"
        if self.kind in (float, int):
            if isinstance(value, float) and not math.isfinite(value):
                return "must be a finite number"
            if self.float32 and not finite_in_float32(value):
                return "overflows float32 (the merge computes in float32)"
            below = self.low is not None and (value <= self.low if self.low_open else value < self.low)
            above = self.high is not None and (value >= self.high if self.high_open else value > self.high)
            if below or above:
                return f"must be {self.range_text()}"
        return None

    def resolve(self, value: Any, *, strict: bool = False) -> Any:
        """The validated value (the default when `value` is None); a clear error otherwise."""
        if value is None:
            if self.required:
                raise RamStudioError(f"parameter {self.name} is required.", self.help)
            return self.default
        try:
            value = self.coerce(value, strict=strict)
        except (TypeError, ValueError, OverflowError):
            raise RamStudioError(f"{self.name}={_short(value)} is not a valid {self.kind.__name__}.",
                                 self.help) from None
        problem = self.problem(value)
        if problem:
            raise RamStudioError(f"invalid {self.name}={_short(value)}: {problem}.", self.help)
        return value


def _boolean(v: Any, strict: bool) -> bool:
    """A yes/no value: a bool, or (from text) 1/0, true/false, yes/no, on/off."""
    if isinstance(v, bool):
        return v
    if strict:
        raise ValueError(v)
    text = str(v).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(v)


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


# ---------------------------------------------------------------- parameters several methods share

EPS = Param("eps", float, 1e-5, "Threshold ε: an element counts as changed when |τ| > ε (paper: 1e-5).",
            low=0.0, float32=True, step=1e-6, label="ε (changed when |τ| > ε)")
LAMBDA = Param("lambda", float, 1.0, "Scaling λ of the merged task vector (paper's grid: 0.1 … 1.0).",
               low=0.0, float32=True, step=0.05, label="λ (task-vector scale)")


def finite_in_float32(value: float) -> bool:
    """Whether `value` stays finite once rounded to float32 (numpy's overflow warning muted)."""
    with np.errstate(over="ignore"):
        return math.isfinite(float(np.float32(value)))

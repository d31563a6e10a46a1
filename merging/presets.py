"""Named presets: published λ rules mapped onto our methods' parameters (declared once; the CLI's --preset, the
Tune and Merge pages and the golden tests use them).

The RAM authors' public script (xiangchi-yuan/mrl, `ram-main.py`) does not use the paper's λ rule. Its default
mode, `arm-r-v2`, scales unique updates by λ_t = 1 + (R − 1)·min(1, ρ_t) with ρ_t = shared_t / unique_t over the
whole model (R = `--rescale_factor`, 1.05 by default, 1.2 in the repository's README): our `ram_plus` with
r = R − 1, α = 1. Its older mode, `arm-r`, uses shared_t / changed_t = ρ_t / (1 + ρ_t): our `ram_plus_soft`
(Eq. 8) with r = R − 1. The script counts over the loaded model's `state_dict()`, which lists a tied embedding
twice (once more as `lm_head.weight`): both presets count so too (`count_tied_twice`). Where they differ from
the script: it replaces R ≤ 1 by 1 (we refuse R < 1), and in `arm-r-v2` an agent with no unique element divides
by zero (we use the limit, λ_t = R, which multiplies nothing).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from merging.common.errors import RamStudioError

SCRIPT_DEFAULT_R = 1.05  # ram-main.py's --rescale_factor default
SCRIPT_README_R = 1.2  # the value its README runs with


@dataclass(frozen=True)
class Preset:
    """A named setting: the method, its parameters, and, for the authors' modes, the rescale factor R."""

    name: str
    method: str
    title: str  # a short label for menus
    summary: str  # the λ rule in words and where it comes from
    fixed: dict[str, Any] = field(default_factory=dict)  # parameters set whatever R is
    uses_r: bool = False  # r = R − 1 (the script's rescale factor)

    def params(self, rescale_factor: float | None = None) -> dict[str, Any]:
        """The method parameters of this preset (for the authors' modes with rescale factor R)."""
        out = dict(self.fixed)
        if self.uses_r:
            out["r"] = rescale_factor_to_r(SCRIPT_DEFAULT_R if rescale_factor is None else rescale_factor)
        elif rescale_factor is not None:
            raise RamStudioError(f"preset {self.name} takes no rescale factor.",
                                 "--rescale-factor goes with the authors' presets (authors-default, authors-soft).")
        return out


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("paper", "ram_plus", "paper RAM+ (r 0.1, α 2)",
           "The paper's RAM+ (Eq. 6): λ_t = 1 + 0.1·clip(ρ_t, 0, 2), ρ_t over the whole model.",
           {"r": 0.1, "alpha": 2.0, "rho_scope": "global"}),
    Preset("authors-default", "ram_plus", "authors' script, default mode (arm-r-v2)",
           "The RAM authors' public script, default mode arm-r-v2: λ_t = 1 + (R − 1)·min(1, ρ_t), ρ_t = shared_t / "
           "unique_t over the whole model, counted as the script counts (over the loaded model's state_dict(), a tied "
           "embedding twice); ram_plus with r = R − 1, α = 1 (R = 1.05 by default, 1.2 in its README).",
           {"alpha": 1.0, "rho_scope": "global", "count_tied_twice": True}, uses_r=True),
    Preset("authors-soft", "ram_plus_soft", "authors' script, older mode (arm-r)",
           "The RAM authors' public script, older mode arm-r: λ_t = 1 + (R − 1)·shared_t / changed_t (= Eq. 8), over "
           "the whole model, counted as the script counts (over the loaded model's state_dict(), a tied embedding "
           "twice); ram_plus_soft with r = R − 1.", {"rho_scope": "global", "count_tied_twice": True}, uses_r=True),
    Preset("mergekit-ramplus-tl", "ram_plus", "mergekit ramplus_tl defaults (r 0.1, α 0.2, per tensor)",
           "mergekit 0.1.5's ramplus_tl defaults: λ = 1 + 0.1·clip(ρ, 0, 0.2) with ρ counted per tensor.",
           {"r": 0.1, "alpha": 0.2, "rho_scope": "tensor"}),
)}


def rescale_factor_to_r(rescale_factor: float) -> float:
    """r = R − 1 for the script's rescale factor R (R ≥ 1; the script silently uses 1 below that)."""
    try:
        value = float(rescale_factor)
    except (TypeError, ValueError):
        raise RamStudioError(f"cannot read the rescale factor {rescale_factor!r}.", "Give a number ≥ 1, e.g. 1.05.") \
            from None
    if not math.isfinite(value) or value < 1.0:
        raise RamStudioError(f"rescale factor R = {rescale_factor} must be a finite number ≥ 1 (λ_t = 1 + (R − 1)·…).",
                             "The authors' script uses R = 1.05 by default and 1.2 in its README; below 1 it "
                             "silently uses 1 (plain RAM).")
    return value - 1.0


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise RamStudioError(f"unknown preset {name!r}.", f"Use one of: {', '.join(PRESETS)}.") from None


def apply_preset(name: str, method: str | None, given: dict[str, Any], rescale_factor: float | None = None
                 ) -> tuple[str, dict[str, Any]]:
    """The method and parameters of preset `name`, merged with parameters given explicitly (ε, say). A given
    method or parameter that contradicts the preset is an error, not silently overridden."""
    preset = get_preset(name)
    if method is not None and method != preset.method:
        raise RamStudioError(f"preset {name} is method {preset.method}, not {method}.",
                             "Drop --method, or drop --preset and set the parameters yourself.")
    params = preset.params(rescale_factor)
    clash = [k for k, v in given.items() if k in params and not _same(v, params[k])]
    if clash:
        shown = ", ".join(f"{k}={given[k]} (preset: {params[k]:.6g})" if isinstance(params[k], float) else
                          f"{k}={given[k]} (preset: {params[k]})" for k in clash)
        raise RamStudioError(f"preset {name} sets {shown}.",
                             "Leave these to the preset, or drop --preset and set the parameters yourself.")
    return preset.method, {**given, **params}


def _same(given: Any, value: Any) -> bool:
    if isinstance(value, float):
        try:
            return float(given) == value
        except (TypeError, ValueError):
            return False
    return str(given) == str(value)


def provenance(name: str, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """What a merge records about the preset it was made with (name, λ rule, R), or None when `method` and
    `params` (ε aside) are not that preset's: a setting changed after choosing a preset is no longer it."""
    preset = get_preset(name)
    if method != preset.method:
        return None
    from merging.methods import get_method

    resolved = get_method(method).resolve_params(params)
    r = resolved.get("r")
    factor = 1.0 + float(r) if preset.uses_r and r is not None else None
    try:
        wanted = get_method(method).resolve_params({**params, **preset.params(factor)})
    except RamStudioError:
        return None
    if wanted != resolved:
        return None
    return {"preset": {"name": preset.name, "summary": preset.summary,
                       **({"rescale_factor": factor} if preset.uses_r else {})}}

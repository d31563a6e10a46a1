"""The models a sweep writes (`--keep best|all|none`): each through the normal merge and export path
(merging/merge.py, its placement rules, recipe and card), into ROOT/<base>-<method>-<hash of the settings>."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from merging.common.errors import Cancelled, RamStudioError
from merging.merge import MergeResult, merge_to_folder
from merging.reading.refs import parse_ref
from merging.recipe import MergeSpec
from merging.writing.placement import check_output_folder, input_folders, suggest_output_name

from .grid import Candidate
from .sweep import SweepResult

KEEP = ("none", "best", "all")


def kept_candidates(res: SweepResult, keep: str) -> list[Candidate]:
    """`best`: the best overall; `all`: every candidate scored without error; `none`: nothing."""
    if keep not in KEEP:
        raise RamStudioError(f"unknown --keep {keep!r}.", f"Use one of {', '.join(KEEP)}.")
    if keep == "best":
        return [res.best] if res.best is not None else []
    if keep == "all":
        return list(dict.fromkeys(e.candidate for e in res.candidates() if e.ok and e.candidate is not None))
    return []


def folder_for(base: str, agents: list[str], c: Candidate, on_mismatch: str, root: Path) -> Path:
    """Where a kept candidate goes: the same name the app suggests for these settings."""
    try:
        label = parse_ref(base).label
    except RamStudioError:
        label = "model"
    fields = {"base": base, "agents": list(agents), "method": c.method, "params": c.param_dict, "out_dtype": None,
              "on_mismatch": on_mismatch}
    return root / suggest_output_name(label, fields)


def check_root(root: Path, base: str, agents: list[str]) -> None:
    """Before a sweep starts: the folder for kept models must be a place a merge may write (placement rules)."""
    check_output_folder(root / "probe", input_folders([base, *agents]), overwrite=False)


@dataclass
class KeepFailure:
    """A candidate --keep could not write: where it was to go and why."""

    candidate: str
    out: Path
    error: str


def keep_models(res: SweepResult, keep: str, root: Path, *, overwrite: bool = False,
                cancel: threading.Event | None = None,
                failures: list[KeepFailure] | None = None) -> list[MergeResult]:
    """Merge and export the kept candidates; returns what was written. With `failures`, a candidate that cannot
    be written (another writer owns its folder, a folder in the way…) is recorded there and the others are still
    written; without it, the first failure is raised. A cancel always stops."""
    spec = res.spec
    out = []
    for c in kept_candidates(res, keep):
        target = folder_for(spec.base, spec.agents, c, spec.on_mismatch, root)
        merge_spec = MergeSpec(spec.base, list(spec.agents), c.method, c.param_dict, str(target),
                               device=spec.device, on_mismatch=spec.on_mismatch)
        try:
            out.append(merge_to_folder(merge_spec, overwrite=overwrite, allow_noop=True, cancel=cancel,
                                       provenance={"sweep": {"candidate": c.label, "select_on": spec.select_on}}))
        except Cancelled:
            raise
        except RamStudioError as exc:
            if failures is None:
                raise
            failures.append(KeepFailure(c.label, target, str(exc)))
    return out

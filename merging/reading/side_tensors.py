"""Per-agent side tensors a merge method reads next to the weights (e.g. each agent's diagonal Fisher): one
float32 safetensors file per agent, holding a tensor of the base's shape for every float tensor of the base.

The files are made elsewhere (evaluation/fisher.py writes them into the analysis cache); here they are only
opened read-only (headers parsed with the same strict reader as a model's shards) and checked against the
base, so that the engine can stream them chunk by chunk like the weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from merging.common.dtypes import FLOAT_CODES
from merging.common.errors import RamStudioError, printable
from merging.reading.checkpoint import Checkpoint
from merging.reading.refs import ModelRef
from merging.reading.safetensors_header import read_header


@dataclass(frozen=True)
class SideTensors:
    """The side tensors of one merge: their `kind` (the method's `side_tensors`), one file per agent in the
    agents' order, what the recipe records about where they came from (`record`, JSON), notes for the model
    card, and the content fingerprint (merging.reading.fingerprint, `weights_xxh3_128`) of each agent they were
    computed from: the merge refuses agents whose content differs from it."""

    kind: str
    files: tuple[Path, ...]
    record: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    computed_from: tuple[str, ...] = ()


def open_side_file(path: Path, label: str) -> Checkpoint:
    """One side file as a read-only Checkpoint (headers only): a regular file, a valid safetensors header."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        raise RamStudioError(f"the {label} file {printable(str(path), 200)} is missing or not a regular file.",
                             "Compute it again (the Fisher pass writes it into the analysis cache).")
    header = read_header(path)
    return Checkpoint(ModelRef(str(path), "local", path=path.parent), path.parent, [header], dict(header.tensors),
                      None)


def open_side_tensors(side: SideTensors, kind: str, base: Checkpoint, labels: list[str]) -> list[Checkpoint]:
    """The side files of a merge, opened and checked: the method's kind, one per agent, and in each a float32
    tensor of the base's shape for every float tensor of the base (one clear line naming the first problem)."""
    if side.kind != kind:
        raise RamStudioError(f"the merge was given {side.kind} side tensors; the method reads {kind}.",
                             "Give the side tensors the method needs.")
    if len(side.files) != len(labels):
        raise RamStudioError(f"{len(side.files)} {kind} files for {len(labels)} agents.",
                             "Give one file per agent, in the agents' order.")
    opened = [open_side_file(f, f"{kind} ({label})") for f, label in zip(side.files, labels)]
    for ckpt, label in zip(opened, labels):
        for name, entry in base.tensors.items():
            if entry.dtype not in FLOAT_CODES:
                continue
            got = ckpt.tensors.get(name)
            if got is None or got.dtype != "F32" or got.shape != entry.shape:
                what = "lacks it" if got is None else f"holds {got.dtype} {list(got.shape)}"
                raise RamStudioError(
                    f"the {kind} file of agent {label} does not match the base at tensor {name!r}: the base holds "
                    f"{list(entry.shape)}, the file {what}.",
                    f"Compute the {kind} again for this agent (it needs the base's tensors, in float32).")
    return opened


def refuse_stale_side(side: SideTensors, labels: list[str], agent_prints: list[str]) -> None:
    """The agents merged must be the ones the side tensors were computed from (compared by content)."""
    for label, was, now in zip(labels, side.computed_from, agent_prints):
        if was != now:
            raise RamStudioError(f"agent {label} changed since its {side.kind} was computed (its content "
                                 "fingerprint differs).", f"Compute the {side.kind} again for the agent as it is now.")

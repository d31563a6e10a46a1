"""Compatibility of base and agents from headers alone: architecture, sizes, dtypes and every mismatch."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from .checkpoint import Checkpoint
from .dtypes import FLOAT_CODES, ITEMSIZE
from .errors import RamStudioError

POLICIES = ("error", "base")
POLICY_HELP = (
    "error: any mismatch stops the run. base: the output keeps the base's tensor set, shapes and dtype; "
    "where an agent lacks a tensor or rows (e.g. a smaller vocabulary) it counts as unchanged there; "
    "an agent's extra tensors or rows are dropped; differing float dtypes are allowed. "
    "Architecture differences and differences in trailing dimensions are always errors."
)


@dataclass(frozen=True)
class ModelHeaders:
    """What the report needs to know about one model: tensor dtypes/shapes, config and size on disk."""

    label: str
    tensors: dict[str, tuple[str, tuple[int, ...]]]
    config: dict | None
    bytes_on_disk: int
    source: str = ""  # resolved folder or repo@revision: the same source twice is the same model

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint) -> "ModelHeaders":
        tensors = {n: (e.dtype, e.shape) for n, e in ckpt.tensors.items()}
        return cls(ckpt.label, tensors, ckpt.config, ckpt.bytes_on_disk, str(ckpt.folder.resolve()))

    @property
    def num_params(self) -> int:
        total = 0
        for _dtype, shape in self.tensors.values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    @property
    def dtype_params(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for dtype, shape in self.tensors.values():
            n = 1
            for d in shape:
                n *= d
            out[dtype] += n
        return dict(out)

    @property
    def architecture(self) -> str:
        cfg = self.config or {}
        archs = cfg.get("architectures") or []
        return archs[0] if archs else (cfg.get("model_type") or "unknown")

    @property
    def tied_embeddings(self) -> bool | None:
        cfg = self.config or {}
        if "tie_word_embeddings" in cfg:
            return bool(cfg["tie_word_embeddings"])
        return None


@dataclass(frozen=True)
class Mismatch:
    """One difference between the base and an agent; `fatal` ones no policy can repair."""

    agent: str
    kind: str  # architecture | missing | extra | shape | dtype | tied_embeddings | duplicate
    tensor: str | None
    detail: str
    fatal: bool = False


@dataclass
class CompatReport:
    """Summary of every model plus the list of mismatches against the base."""

    base: ModelHeaders
    agents: list[ModelHeaders]
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def models_frame(self) -> pd.DataFrame:
        """One row per model: role, architecture, parameters, dtypes, bytes on disk."""
        rows = []
        for role, m in [("base", self.base)] + [("agent", a) for a in self.agents]:
            rows.append({
                "role": role, "model": m.label, "architecture": m.architecture,
                "params": m.num_params, "tensors": len(m.tensors),
                "dtypes": ", ".join(f"{k} ({v:,})" for k, v in sorted(m.dtype_params.items())),
                "bytes_on_disk": m.bytes_on_disk, "tied_embeddings": m.tied_embeddings,
            })
        return pd.DataFrame(rows)

    def mismatches_frame(self) -> pd.DataFrame:
        return pd.DataFrame([m.__dict__ for m in self.mismatches],
                            columns=["agent", "kind", "tensor", "detail", "fatal"])

    def enforce(self, policy: str = "error") -> None:
        """Raise a clear error for mismatches the chosen policy does not cover."""
        if policy not in POLICIES:
            raise RamStudioError(f"unknown mismatch policy {policy!r}.", f"Use one of {', '.join(POLICIES)}.")
        blocking = [m for m in self.mismatches if m.fatal or policy == "error"]
        if not blocking:
            return
        shown = "; ".join(_describe(m) for m in blocking[:6])
        more = f" (and {len(blocking) - 6} more)" if len(blocking) > 6 else ""
        repairable = not any(m.fatal for m in blocking)
        hint = ("Run `python -m merging inspect` for the full list. "
                + ("Pass --on-mismatch base to keep the base's tensors and shapes." if repairable
                   else "These models cannot be merged: they must share one base architecture."))
        raise RamStudioError(f"base and agents do not match: {shown}{more}.", hint)


def _describe(m: Mismatch) -> str:
    where = f" {m.tensor!r}" if m.tensor else ""
    return f"{m.agent}: {m.kind}{where} ({m.detail})"


def check_compatibility(base: ModelHeaders, agents: list[ModelHeaders]) -> CompatReport:
    """Compare every agent's headers (and config) with the base's."""
    report = CompatReport(base, agents)
    out = report.mismatches
    seen: dict[str, str] = {}
    for a in agents:
        if a.source and a.source == base.source:
            out.append(Mismatch(a.label, "duplicate", None, "this agent is the base model itself: "
                                "its task vector is zero", fatal=True))
        if a.source and a.source in seen:
            out.append(Mismatch(a.label, "duplicate", None, f"same model as agent {seen[a.source]}; "
                                "giving one agent twice would double its weight", fatal=True))
        seen.setdefault(a.source or a.label, a.label)
        if base.architecture != a.architecture:
            out.append(Mismatch(a.label, "architecture", None,
                                f"base is {base.architecture}, agent is {a.architecture}", fatal=True))
        if (base.tied_embeddings is not None and a.tied_embeddings is not None
                and base.tied_embeddings != a.tied_embeddings):
            out.append(Mismatch(a.label, "tied_embeddings", None,
                                f"base tie_word_embeddings={base.tied_embeddings}, agent {a.tied_embeddings}"))
        for name in base.tensors.keys() - a.tensors.keys():
            out.append(Mismatch(a.label, "missing", name, "tensor absent from agent"))
        for name in a.tensors.keys() - base.tensors.keys():
            out.append(Mismatch(a.label, "extra", name, "tensor absent from base"))
        for name in sorted(base.tensors.keys() & a.tensors.keys()):
            (bd, bs), (ad, as_) = base.tensors[name], a.tensors[name]
            if bs != as_:
                rows_only = len(bs) == len(as_) and len(bs) >= 1 and bs[1:] == as_[1:]
                out.append(Mismatch(a.label, "shape", name, f"base {list(bs)}, agent {list(as_)}",
                                    fatal=not rows_only))
            if bd != ad:
                both_float = bd in FLOAT_CODES and ad in FLOAT_CODES
                out.append(Mismatch(a.label, "dtype", name, f"base {bd}, agent {ad}", fatal=not both_float))
    out.sort(key=lambda m: (m.agent, m.kind, m.tensor or ""))
    return report


def estimate_bytes(base: ModelHeaders, out_dtype: str | None = None) -> int:
    """Bytes the merged model will take on disk (base shapes, output dtype), excluding small files."""
    total = 0
    for dtype, shape in base.tensors.values():
        n = 1
        for d in shape:
            n *= d
        code = out_dtype if (out_dtype and dtype in FLOAT_CODES) else dtype
        total += n * ITEMSIZE[code]
    return total

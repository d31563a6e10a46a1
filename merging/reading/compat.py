"""Compatibility of base and agents from headers alone: architecture, sizes, dtypes and every mismatch."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from merging.common.dtypes import FLOAT_CODES, ITEMSIZE
from merging.common.errors import RamStudioError, printable
from merging.reading.checkpoint import Checkpoint
from merging.reading.layout import LayoutMap, map_layout

if TYPE_CHECKING:  # imported where a frame is built, so that a merge starts reading sooner
    import pandas as pd

POLICIES = ("error", "base")
# Under the 'base' policy an agent may lose (have dropped) at most this share of its elements: more means
# the models do not line up (a name prefix, a PEFT checkpoint, fused experts), not a resized vocabulary.
MAX_DROPPED_SHARE = 0.01
POLICY_HELP = (
    "error: any mismatch stops the run. base: the output keeps the base's tensor set, shapes and dtype; "
    "where an agent lacks a tensor or rows (e.g. a smaller vocabulary) it counts as unchanged there; "
    "an agent's extra tensors or rows are dropped (at most 1 % of its elements); differing float dtypes "
    "are allowed. Architecture differences and differences in trailing dimensions are always errors."
)


@dataclass(frozen=True)
class ModelHeaders:
    """What the report needs to know about one model: tensor dtypes/shapes, config and size on disk."""

    label: str
    tensors: dict[str, tuple[str, tuple[int, ...]]]
    config: dict | None
    bytes_on_disk: int
    source: str = ""  # resolved folder or repo@revision: the same source twice is the same model
    layout: LayoutMap | None = None  # set when `tensors` is this agent read in the base's layout

    def in_layout_of(self, base: "ModelHeaders") -> "ModelHeaders":
        """These headers as the base names its tensors (merging/reading/layout.py): fused ↔ per-expert MoE
        experts and legacy ↔ prefixed vision-language names are the same weights. Unchanged when nothing maps;
        with `layout` set (and only its `problems`) when a layout difference could not be mapped."""
        from dataclasses import replace

        layout = map_layout(base.tensors, self.tensors, base.config, self.config)
        if layout is None:
            return self
        return replace(self, tensors=layout.view(self.tensors) if layout.sources else self.tensors, layout=layout)

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
        archs = cfg.get("architectures")
        if isinstance(archs, list) and archs and isinstance(archs[0], str):
            return printable(archs[0], 80)
        kind = cfg.get("model_type")
        return printable(kind, 80) if isinstance(kind, str) and kind else "unknown"

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
    kind: str  # architecture | missing | extra | shape | dtype | tied_embeddings | untied_head | duplicate
    tensor: str | None
    detail: str
    fatal: bool = False


@dataclass(frozen=True)
class AgentLoss:
    """What the 'base' policy does to one agent: elements dropped (extra tensors or rows) and elements
    where it counts as unchanged because it lacks them (missing tensors or rows)."""

    agent: str
    total: int
    dropped_tensors: int
    dropped: int
    padded_tensors: int
    padded: int

    @property
    def dropped_share(self) -> float:
        return self.dropped / self.total if self.total else 0.0

    def describe(self) -> str:
        return (f"{self.agent}: {self.dropped:,} elements dropped ({100 * self.dropped_share:.2f} %, "
                f"{self.dropped_tensors} tensors), {self.padded:,} counted as unchanged "
                f"({self.padded_tensors} tensors)")


@dataclass
class CompatReport:
    """Summary of every model plus the list of mismatches against the base."""

    base: ModelHeaders
    agents: list[ModelHeaders]
    mismatches: list[Mismatch] = field(default_factory=list)
    # (agent, tensor) → why: an agent's extra tensor or rows that are explained, not dropped (a head equal to its
    # embeddings, rows of a union vocabulary; merging/reading/prepare.py)
    handled: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def models_frame(self) -> pd.DataFrame:
        """One row per model: role, architecture, parameters, dtypes, bytes on disk."""
        import pandas as pd

        rows = []
        for role, m in [("base", self.base)] + [("agent", a) for a in self.agents]:
            rows.append({
                "role": role, "model": m.label, "architecture": m.architecture,
                "params": m.num_params, "tensors": _stored_count(m),
                "dtypes": ", ".join(f"{k} ({v:,})" for k, v in sorted(m.dtype_params.items())),
                "bytes_on_disk": m.bytes_on_disk, "tied_embeddings": m.tied_embeddings,
                "layout": "mapped to the base's" if m.layout is not None and m.layout.sources else "as stored",
            })
        return pd.DataFrame(rows)

    def layout_notes(self) -> list[tuple[str, str]]:
        """(agent, line) for every agent read in the base's layout: what was mapped (inspect shows them)."""
        return [(a.label, note) for a in self.agents if a.layout is not None for note in a.layout.notes]

    def aligned(self, agents: list[Checkpoint]) -> list[Checkpoint]:
        """The agents' checkpoints (in this report's order) read in the base's layout where their headers map."""
        from merging.reading.mapped import with_layout

        return [with_layout(c, h.layout) for c, h in zip(agents, self.agents)]

    def mismatches_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([m.__dict__ for m in self.mismatches],
                            columns=["agent", "kind", "tensor", "detail", "fatal"])

    def losses(self) -> list[AgentLoss]:
        """Per agent, what the 'base' policy drops or pads (agents without mismatches lose nothing)."""
        out = []
        for a in self.agents:
            if a.tensors == self.base.tensors:  # the same names, dtypes and shapes: nothing to drop or pad
                out.append(AgentLoss(a.label, a.num_params, 0, 0, 0, 0))
                continue
            dropped = padded = dropped_t = padded_t = 0
            for name, (_dtype, shape) in a.tensors.items():
                if (a.label, name) in self.handled:
                    continue
                base = self.base.tensors.get(name)
                if base is None:
                    dropped += math.prod(shape)
                    dropped_t += 1
                elif shape != base[1] and len(shape) == len(base[1]) and shape[1:] == base[1][1:]:
                    row = math.prod(shape[1:])
                    dropped += max(0, shape[0] - base[1][0]) * row
                    padded += max(0, base[1][0] - shape[0]) * row
                    dropped_t += shape[0] > base[1][0]
                    padded_t += shape[0] < base[1][0]
            for name, (_dtype, shape) in self.base.tensors.items():
                if name not in a.tensors:
                    padded += math.prod(shape)
                    padded_t += 1
            out.append(AgentLoss(a.label, a.num_params, dropped_t, dropped, padded_t, padded))
        return out

    def enforce(self, policy: str = "error") -> None:
        """Raise a clear error for mismatches the chosen policy does not cover."""
        if policy not in POLICIES:
            raise RamStudioError(f"unknown mismatch policy {policy!r}.", f"Use one of {', '.join(POLICIES)}.")
        blocking = [m for m in self.mismatches if m.fatal or policy == "error"]
        if not blocking:
            self._refuse_heavy_loss()
            return
        shown = "; ".join(_describe(m) for m in blocking[:6])
        more = f" (and {len(blocking) - 6} more)" if len(blocking) > 6 else ""
        repairable = not any(m.fatal for m in blocking)
        kinds = {m.kind for m in blocking if m.fatal}
        if repairable:
            fix = "Pass --on-mismatch base to keep the base's tensors and shapes." + (
                " For an untied head, --untie (merge) keeps it." if any(m.kind == "untied_head" for m in blocking)
                else "")
        elif kinds == {"duplicate"}:  # the architecture is fine: the same model was given twice
            fix = "Give each agent once, and not the base as an agent."
        else:
            fix = ("These models cannot be merged: they must share one base architecture."
                   + (" Give each agent once, and not the base as an agent." if "duplicate" in kinds else ""))
        hint = "Run `ram-studio inspect` for the full list. " + fix
        hints = layout_hints(self.base, self.agents)
        raise RamStudioError(f"base and agents do not match: {shown}{more}.", " ".join(hints) if hints else hint)

    def _refuse_heavy_loss(self) -> None:
        """Under the 'base' policy, an agent that would lose more than a small share of itself is refused."""
        heavy = [loss for loss in self.losses() if loss.dropped_share > MAX_DROPPED_SHARE]
        if heavy:
            hints = layout_hints(self.base, self.agents) or [
                "Its tensors do not line up with the base's; check that it was fine-tuned from this base."]
            raise RamStudioError(
                f"the 'base' mismatch policy would drop {100 * heavy[0].dropped_share:.2f} % of agent "
                f"{heavy[0].agent} (more than {100 * MAX_DROPPED_SHARE:g} %).", " ".join(hints))


def _stored_count(m: ModelHeaders) -> int:
    """How many tensors a model stores (an agent read in the base's layout is shown with its own count)."""
    if m.layout is None:
        return len(m.tensors)
    return len(m.tensors) - len(m.layout.sources) + len(m.layout.consumed)


def layout_hints(base: ModelHeaders, agents: list[ModelHeaders]) -> list[str]:
    """Likely reasons why an agent's tensor names do not match the base's, one hint each."""
    hints = []
    b = set(base.tensors)
    for a in agents:
        names = set(a.tensors)
        if names == b:
            continue
        if any(n.startswith("base_model.model.") for n in names):
            hints.append(f"{a.label} has PEFT names (base_model.model.…): this is a LoRA/PEFT checkpoint: merge "
                         "it into full weights with peft first (merge_and_unload, then save_pretrained).")
        elif {n.removeprefix("model.") for n in b} == {n.removeprefix("model.") for n in names}:
            hints.append(f"{a.label} names its tensors without (or with) the 'model.' prefix the base "
                         "uses: re-save it with the same transformers class as the base.")
        elif a.layout is not None and a.layout.problems:
            hints.append(f"{a.label} stores some weights in another layout that could not be read in the base's: "
                         + "; ".join(a.layout.problems) + ".")
    return hints


def _describe(m: Mismatch) -> str:
    where = f" {m.tensor!r}" if m.tensor else ""
    return f"{m.agent}: {m.kind}{where} ({m.detail})"


def check_compatibility(base: ModelHeaders, agents: list[ModelHeaders]) -> CompatReport:
    """Compare every agent's headers (and config) with the base's."""
    agents = [a.in_layout_of(base) for a in agents]  # fused/per-expert and legacy/prefixed names line up
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
        if a.tensors == base.tensors:  # the usual case, compared at C speed (a model may have 100,000 tensors)
            continue
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

"""Lineage check: is each agent a fine-tune of *this* base? A cheap look before any pass.

An agent fine-tuned from another checkpoint (an SFT cold start, the pretrained model instead of the instruct
one, another random init) still has the base's tensor names and shapes, so nothing else notices it; but its
task vector is the distance between two models, dense and large, and it turns every other agent's update into
"shared". Measured here on a fixed sample (a block of rows from the middle of up to SAMPLE_TENSORS matrices
spread through the model, at most SAMPLE_ELEMS elements each: ~64K elements a model, a few reads):

- the density at ε (|τ| > ε) and the relative update norm ‖τ‖ / ‖θ0‖ of each agent;
- the names an agent gives its own base: `_name_or_path` in config.json, `base_model` in its model card.

A warning names the agent and what was measured when (thresholds, and the measurements behind them, in the
"Your models" documentation):
- ‖τ‖ / ‖θ0‖ ≥ DIFFERENT_MODEL_NORM with a density ≥ DENSE: every weight moved, as far as unrelated weights
  (another random init gives ≈ 1);
- density ≥ DENSE and its unchanged share is at most 1/UNCHANGED_FACTOR of the sparsest other agent's, which is
  itself not dense: a dense change among sparse ones (an SFT-like update or another checkpoint); agents that are
  all dense (fp32 checkpoints, where every update shows) are not told apart by density;
- ‖τ‖ / ‖θ0‖ more than NORM_FACTOR × the largest of the other agents';
- its config or card names a base whose name is not the base's (when the base has a name to compare).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from merging.common.dtypes import FLOAT_CODES
from merging.common.errors import RamStudioError, printable
from merging.common.untrusted import TooComplex, loads_yaml
from merging.reading.checkpoint import Checkpoint, tensor_order
from merging.reading.model_folder import check_file, open_checked

SAMPLE_TENSORS = 16
SAMPLE_ELEMS = 4096
EPS = 1e-5
DIFFERENT_MODEL_NORM = 0.3
DENSE = 0.95
UNCHANGED_FACTOR = 10.0
NORM_FACTOR = 10.0
MIN_SAMPLE = 1000  # elements: below this (toy models) a density or norm says too little to warn on
MAX_CARD_BYTES = 1 << 20
MAX_FRONT_MATTER = 64 << 10
_GENERIC = re.compile(r"^(base|model|models|hf|checkpoint|ckpt|step|global_step|actor|policy|merged|output|outputs"
                      r"|tmp\w*|final|latest|snapshot|main|\.)?[-_]?\d*$")


@dataclass(frozen=True)
class UpdateSample:
    """One agent's update on the sample: elements, changed at ε, Σ τ² and Σ θ0² (float64)."""

    elements: int
    changed: int
    sq_tau: float
    sq_base: float

    @property
    def density(self) -> float:
        return self.changed / self.elements if self.elements else 0.0

    @property
    def rel_norm(self) -> float:
        return math.sqrt(self.sq_tau / self.sq_base) if self.sq_base > 0 else 0.0


@dataclass(frozen=True)
class LineageWarning:
    """One agent that may not be a fine-tune of this base, and why, in one line (`text` starts with 'agent')."""

    agent: str
    reason: str  # different_model | dense | norm | name
    text: str


def sample_spans(base: Checkpoint) -> list[tuple[str, int, int]]:
    """(tensor, first row, stop row) of the sample: a middle block of up to SAMPLE_TENSORS matrices spread
    evenly through the on-disk order (every float tensor when there are no matrices)."""
    names = [n for n in tensor_order(base) if base.tensors[n].dtype in FLOAT_CODES and base.tensors[n].numel]
    mats = [n for n in names if len(base.tensors[n].shape) >= 2] or names
    step = max(1, len(mats) / SAMPLE_TENSORS)
    picked = [mats[int(i * step)] for i in range(min(SAMPLE_TENSORS, len(mats)))]
    out = []
    for n in picked:
        shape = base.tensors[n].shape
        if not shape:
            out.append((n, 0, 1))
            continue
        per_row = max(1, math.prod(shape[1:]))
        k = max(1, min(shape[0], SAMPLE_ELEMS // per_row))
        first = (shape[0] - k) // 2
        out.append((n, first, first + k))
    return out


def sample_update(base: Checkpoint, agent: Checkpoint, spans: list[tuple[str, int, int]], eps: float = EPS
                  ) -> UpdateSample:
    """The agent's update on the sample (tensors it lacks or stores in another shape are skipped)."""
    elements = changed = 0
    sq_tau = sq_base = 0.0
    for name, a, b in spans:
        e = agent.tensors.get(name)
        if e is None or e.shape[1:] != base.tensors[name].shape[1:] or (e.shape and e.shape[0] < b):
            continue
        t0 = _read(base, name, a, b)
        tau = _read(agent, name, a, b) - t0
        finite = torch.isfinite(tau) & torch.isfinite(t0)
        tau, t0 = tau[finite], t0[finite]
        elements += tau.numel()
        changed += int((tau.abs() > eps).sum())
        sq_tau += float((tau.double() ** 2).sum())
        sq_base += float((t0.double() ** 2).sum())
    return UpdateSample(elements, changed, sq_tau, sq_base)


def _read(ckpt: Checkpoint, name: str, a: int, b: int) -> torch.Tensor:
    t = ckpt.read(name) if not ckpt.tensors[name].shape else ckpt.read(name, a, b)
    return t.to(torch.float32).reshape(-1)


def numeric_warnings(labels: list[str], samples: list[UpdateSample], eps: float = EPS) -> list[LineageWarning]:
    """The rules on the measured densities and norms (see the module's docstring); a sample of fewer than
    MIN_SAMPLE elements (a toy model) is too small to judge."""
    out = []
    for i, (label, s) in enumerate(zip(labels, samples)):
        if s.elements < MIN_SAMPLE:
            continue
        others = [o for j, o in enumerate(samples) if j != i and o.elements >= MIN_SAMPLE]
        sparsest = max((1 - o.density for o in others), default=0.0)  # the largest unchanged share among the others
        what = (f"density {100 * s.density:.2f} % at ε = {eps:g}, ‖τ‖/‖θ0‖ = {s.rel_norm:.3g}"
                + (f" (other agents: density ≤ {100 * max(o.density for o in others):.2f} %, ‖τ‖/‖θ0‖ ≤ "
                   f"{max(o.rel_norm for o in others):.3g})" if others else "")
                + f", on a sample of {s.elements:,} elements")
        if s.rel_norm >= DIFFERENT_MODEL_NORM and s.density >= DENSE:
            out.append(LineageWarning(label, "different_model", f"agent {label} is as far from the base as "
                                      f"unrelated weights would be ({what}): it was not fine-tuned from this base."))
        elif sparsest > 1 - DENSE and s.density >= DENSE and (1 - s.density) * UNCHANGED_FACTOR <= sparsest:
            out.append(LineageWarning(label, "dense", f"agent {label} changed almost every weight, unlike the other "
                                      f"agents ({what}): a dense change (an SFT-like update, or another checkpoint "
                                      "as its starting point) rather than an RL fine-tune of this base."))
        elif others and s.rel_norm > NORM_FACTOR * max(o.rel_norm for o in others) > 0:
            out.append(LineageWarning(label, "norm", f"agent {label}'s update is more than {NORM_FACTOR:g}× larger "
                                      f"than any other agent's ({what}): check that it was fine-tuned from this base."))
    return out


def _key(name: str) -> str:
    """A model name for comparing: the last path part, lowercased, without a revision or cache prefix."""
    last = name.strip().rstrip("/").split("@", 1)[0].replace("\\", "/").rsplit("/", 1)[-1]
    if last.startswith("models--"):
        last = last.split("--")[-1]
    return last.lower()


def card_base_models(ckpt: Checkpoint) -> list[str]:
    """`base_model` from the YAML front matter of the folder's README.md (bounded; [] when absent or unreadable)."""
    try:
        ident = check_file(ckpt.folder, "README.md", max_bytes=MAX_CARD_BYTES)
        with open_checked(ident) as f:
            text = f.read(MAX_CARD_BYTES + 1).decode("utf-8", "replace")
    except (FileNotFoundError, RamStudioError, OSError):
        return []
    if not text.startswith("---"):
        return []
    end = text.find("\n---", 3)
    if end < 0 or end > MAX_FRONT_MATTER:
        return []
    try:
        meta = loads_yaml(text[3:end])
    except (TooComplex, ValueError, Exception):  # noqa: BLE001 - a broken card says nothing about lineage
        return []
    value = meta.get("base_model") if isinstance(meta, dict) else None
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return [v for v in items if isinstance(v, str) and v.strip()][:16]


def claimed_bases(ckpt: Checkpoint) -> list[tuple[str, str]]:
    """(where, name) of each base a model names for itself: config `_name_or_path`, card `base_model`."""
    out = []
    name = (ckpt.config or {}).get("_name_or_path")
    if isinstance(name, str) and name.strip():
        out.append(("config.json _name_or_path", name))
    out += [("model card base_model", v) for v in card_base_models(ckpt)]
    return out


def base_names(base: Checkpoint) -> set[str]:
    """The names the base goes by: its Hub id, its folder's name, its config `_name_or_path` (generic ones dropped)."""
    names = [base.ref.repo_id or "", base.folder.name if base.ref.kind != "hub" else "",
             str((base.config or {}).get("_name_or_path") or "")]
    return {k for k in map(_key, names) if k and not _GENERIC.match(k)}


def name_warnings(base: Checkpoint, agents: list[Checkpoint], labels: list[str]) -> list[LineageWarning]:
    """Agents whose config or card names a base other than this one (only when the base has a name)."""
    known = base_names(base)
    if not known:
        return []
    out = []
    for agent, label in zip(agents, labels):
        own = {_key(agent.ref.repo_id or ""), _key(agent.folder.name)}
        for where, name in claimed_bases(agent):
            k = _key(name)
            if k and k not in known and k not in own and not _GENERIC.match(k):
                out.append(LineageWarning(label, "name", f"agent {label}'s {where} names "
                                          f"{printable(name, 120)!r} as its base, not this base "
                                          f"({', '.join(sorted(printable(n, 80) for n in known))})."))
                break
    return out


def check_lineage(base: Checkpoint, agents: list[Checkpoint], labels: list[str], eps: float = EPS
                  ) -> tuple[list[LineageWarning], list[UpdateSample]]:
    """Every warning about the agents' lineage, and the samples measured."""
    spans = sample_spans(base)
    samples = [sample_update(base, a, spans, eps) for a in agents]
    for c in [base, *agents]:
        c.release()
    return numeric_warnings(labels, samples, eps) + name_warnings(base, agents, labels), samples

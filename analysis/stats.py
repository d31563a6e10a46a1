"""The analysis: one streaming read of base + agents (analysis/scan.py) → tidy per-agent × tensor × ε statistics,
cached on disk."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from merging.common.device import pick_device
from merging.common.dtypes import FLOAT_CODES
from merging.common.errors import RamStudioError
from merging.common.timeline import mark
from merging.passes import ProgressFn
from merging.reading.checkpoint import Checkpoint, open_checkpoint
from merging.reading.chunks import DEFAULT_CHUNK_ELEMS
from merging.reading.prepare import prepare_inputs
from merging.recipe import check_agent_count

from . import cache
from .ladder import DEFAULT_LADDER
from .ladder_check import MAX_LADDER, validate_ladder  # noqa: F401 (re-exported: the CLI checks a ladder early)
from .scan import run_pass
from .units import DOMINATED, GROUP_COLUMNS, MANY_TENSORS, PAIR_SUMS, TensorCounts

if TYPE_CHECKING:  # pandas is imported where a frame is built: not before the pass starts reading
    import pandas as pd

DOMINATED_COLUMNS = DOMINATED  # Σ τ_t² where partners' Σ|τ| < f·|τ_t|
STAT_COLUMNS = ["changed", "shared", "unique", "norm_unique", "norm_shared", "sign_conflicts", "dot_others",
                "sq_others", *DOMINATED_COLUMNS]
PAIR_COLUMNS = PAIR_SUMS
# The number format's view (analysis.precision): per agent × tensor × ε; changed_any is the same at every ε,
# eps_below_step the same for every agent.
PRECISION_COLUMNS = ["changed_any", "one_step", "sq_one_step", "chance_unique_binade", "eps_below_step"]
UNITS = ("abs", "steps")  # the ladder holds absolute ε values, or counts of representable steps


@dataclass
class AnalysisResult:
    """Statistics of one base + agents set; `frame` has one row per agent × unit × ε, `pairs` one row per
    pair of agents (a, b in the order of `agents`) × unit × ε, on the elements both changed. A unit is one
    tensor, or for a model of very many tensors one group of tensors with the same place in the model (then
    `tensor_counts` holds each tensor's shared and unique counts; analysis/units.py)."""

    base: str
    agents: list[str]
    ladder: tuple[float, ...]
    total_params: int
    frame: pd.DataFrame
    seconds: float
    pairs: pd.DataFrame
    fingerprint: str = ""
    from_cache: bool = False
    refs: list[str] = field(default_factory=list)
    # lineage warnings measured before the pass ({"agent", "reason", "text"}: merging/reading/lineage.py), not cached
    lineage: list[dict] = field(default_factory=list)
    unit: str = "abs"  # "steps": the ladder (and the frames' eps column) counts representable steps
    tensor_counts: TensorCounts | None = None

    @property
    def grouped(self) -> bool:
        """Whether the frames' rows are groups of tensors rather than tensors."""
        return self.tensor_counts is not None

    def covers(self, rule) -> bool:
        """Whether this analysis has counts for `rule` (an absolute ε, or merging.methods.steps.Steps)."""
        from merging.methods.steps import Steps

        if isinstance(rule, Steps):
            return self.unit == "steps" and rule.k in self.ladder
        return self.unit == "abs" and rule in self.ladder

    def counts_at(self, eps) -> dict[str, list[int]]:
        """Whole-model shared/unique counts per agent at ε (what global ρ_t needs); an ε of the ladder, or a
        `Steps` rule of a ladder in steps."""
        from merging.methods.steps import Steps

        if isinstance(eps, Steps) or self.unit != "abs":
            if not self.covers(eps):
                raise RamStudioError(f"{eps} is not in the analysed ladder {list(self.ladder)} ({self.unit}).",
                                     "Re-run the analysis with this threshold in its ladder.")
            eps = eps.k if isinstance(eps, Steps) else eps
        rows = self.frame[self.frame["eps"] == eps]
        if rows.empty:
            raise RamStudioError(f"ε={eps:g} is not in the analysed ladder {list(self.ladder)}.",
                                 "Re-run the analysis with this ε in --eps-ladder.")
        g = rows.groupby("agent", sort=False)[["shared", "unique"]].sum()
        g = g.reindex(self.agents)
        return {"shared": [int(v) for v in g["shared"]], "unique": [int(v) for v in g["unique"]]}

    def reordered(self, refs: list[str]) -> "AnalysisResult | None":
        """The same statistics with the agents listed in the order of `refs` (base first; the same references
        in another order): no statistic depends on the order, so a reordered selection needs no new pass.
        None when `refs` are not a reordering of this result's references (or their labels are ambiguous)."""
        import dataclasses

        if not self.refs or refs[0] != self.refs[0] or sorted(refs[1:]) != sorted(self.refs[1:]) \
                or len(set(self.refs[1:])) != len(self.refs) - 1 or len(set(self.agents)) != len(self.agents):
            return None
        label = dict(zip(self.refs[1:], self.agents))  # labels stay with their model whatever the order
        agents = [label[r] for r in refs[1:]]
        pos = {a: i for i, a in enumerate(agents)}
        def in_order(table, by: list[str]):  # rows stay grouped by tensor as a pass writes them
            tensors = {t: i for i, t in enumerate(dict.fromkeys(table["tensor"]))}
            order = {"tensor": tensors, **{c: pos for c in by}}
            return table.sort_values(["tensor", *by], key=lambda c: c.map(order[c.name]), kind="stable") \
                .reset_index(drop=True)

        frame = in_order(self.frame, ["agent"])
        pairs = self.pairs.copy()
        if not pairs.empty:  # each pair (a, b) in the new order; only the per-side sums swap with it
            flip = pairs["a"].map(pos) > pairs["b"].map(pos)
            pairs.loc[flip, ["a", "b", "sq_a", "sq_b"]] = pairs.loc[flip, ["b", "a", "sq_b", "sq_a"]].to_numpy()
            pairs = in_order(pairs, ["a", "b"])
        counts = self.tensor_counts
        if counts is not None:
            perm = [self.agents.index(a) for a in agents]
            counts = dataclasses.replace(counts, shared=counts.shared[:, perm], unique=counts.unique[:, perm])
        return dataclasses.replace(self, agents=agents, frame=frame, pairs=pairs, refs=list(refs),
                                   tensor_counts=counts)

    def to_payload(self) -> dict:
        """What the cache keeps (analysis/cache_format.py): scalar fields, the frames, the per-tensor counts."""
        meta = {"base": self.base, "agents": self.agents, "ladder": list(self.ladder),
                "total_params": self.total_params, "seconds": self.seconds, "refs": self.refs, "unit": self.unit}
        arrays = {}
        if self.tensor_counts is not None:
            c = self.tensor_counts
            meta["tensor_names"] = list(c.names)
            meta["unit_labels"] = list(c.unit_labels)
            arrays = {"tensor_unit": c.unit, "tensor_shared": c.shared, "tensor_unique": c.unique}
        return {"meta": meta, "tables": {"frame": self.frame, "pairs": self.pairs}, "arrays": arrays}

    @classmethod
    def from_payload(cls, p: dict, fingerprint: str) -> "AnalysisResult":
        """The result a `to_payload` entry holds; ValueError (or KeyError, TypeError) when it is incomplete."""
        m, frame, pair_frame = p["meta"], p["tables"]["frame"], p["tables"]["pairs"]
        if not {"agent", "tensor", "eps", *STAT_COLUMNS, *PRECISION_COLUMNS, *GROUP_COLUMNS} <= set(frame.columns) \
                or frame.empty:
            raise ValueError("incomplete cached frame")
        if not {"a", "b", "tensor", "eps", *PAIR_COLUMNS} <= set(pair_frame.columns) and len(m["agents"]) > 1:
            raise ValueError("incomplete cached pair frame")
        if m.get("unit", "abs") not in UNITS:
            raise ValueError("unknown unit")
        agents, ladder = list(m["agents"]), tuple(float(e) for e in m["ladder"])
        if len(frame) % max(1, len(agents) * len(ladder)):
            raise ValueError("cached frame of the wrong size")
        return cls(m["base"], agents, ladder, int(m["total_params"]), frame, float(m["seconds"]), pair_frame,
                   fingerprint, True, list(m.get("refs", [])), unit=m.get("unit", "abs"),
                   tensor_counts=_counts(p, agents, ladder))


def _counts(p: dict, agents: list[str], ladder: tuple[float, ...]) -> TensorCounts | None:
    """The cached per-tensor counts, checked against the frame's shape (None when rows are tensors)."""
    arrays = p["arrays"]
    if "tensor_unit" not in arrays:
        return None
    names, labels = p["meta"]["tensor_names"], p["meta"]["unit_labels"]
    unit, shared, unique = arrays["tensor_unit"], arrays["tensor_shared"], arrays["tensor_unique"]
    shape = (len(names), len(agents), len(ladder))
    texts = isinstance(names, list) and isinstance(labels, list) and all(isinstance(n, str) for n in names + labels)
    if not texts or shared.shape != shape or unique.shape != shape or unit.shape != shape[:1] \
            or (len(unit) and not 0 <= unit.min() <= unit.max() < len(labels)):
        raise ValueError("inconsistent cached tensor counts")
    return TensorCounts(names, unit, shared, unique, labels)


def _open_all(base: Checkpoint | str, agents: Sequence[Checkpoint | str],
              download: bool = True) -> tuple[Checkpoint, list[Checkpoint]]:
    b = base if isinstance(base, Checkpoint) else open_checkpoint(base, download=download)
    return b, [a if isinstance(a, Checkpoint) else open_checkpoint(a, download=download) for a in agents]


def analyze(base: Checkpoint | str, agents: Sequence[Checkpoint | str], *,
            ladder: Sequence[float] = DEFAULT_LADDER, device: str = "auto",
            chunk_elems: int = DEFAULT_CHUNK_ELEMS, policy: str = "error", use_cache: bool = True,
            progress: ProgressFn | None = None, cancel: threading.Event | None = None,
            warn: Callable[[str], None] | None = None, unit: str = "abs") -> AnalysisResult:
    """Compute overlap statistics for every agent × tensor × ε in one streaming pass (cached on disk); `warn`
    hears each lineage warning (a line naming the agent) before the pass starts. With `unit="steps"` the ladder
    counts representable steps of each base tensor's stored dtype at the base weight (merging.methods.steps):
    |τ| > K steps counts as changed."""
    ladder = validate_ladder(ladder)
    if unit not in UNITS:
        raise RamStudioError(f"unknown threshold unit {unit!r}.", f"Use one of {', '.join(UNITS)}.")
    check_agent_count(len(agents))  # before anything is opened
    b, ags = _open_all(base, agents)
    if not ags:
        raise RamStudioError("no agents given.", "Give the base and at least one agent.")
    prep = prepare_inputs(b, ags, policy=policy)  # tied heads, added tokens, lineage: merging/reading/prepare.py
    prep.enforce(policy)
    ags, labels = prep.agent_views, prep.labels  # agents in another layout (fused experts, …) read in the base's
    lineage = [w.__dict__ for w in prep.lineage]
    for w in prep.lineage if warn is not None else []:
        warn(w.text)
    mark("inputs compared (headers, layouts, lineage)")
    key = cache.fingerprint(b, ags, ladder, policy, unit)
    folder = cache.check_location([b, *ags]) if use_cache else None
    if folder is not None:
        payload = cache.load(key, folder)
        if payload is not None:
            try:
                result = AnalysisResult.from_payload(payload, key)
                result.agents = labels
                result.lineage = lineage
                return result
            except (KeyError, ValueError, TypeError):
                pass  # a damaged entry is rebuilt below
    out = run_pass(b, ags, labels, ladder, pick_device(device), chunk_elems, progress, cancel, unit == "steps",
                   grouped=float_tensors(b) > MANY_TENSORS)
    result = AnalysisResult(b.label, labels, ladder, out.total, out.frame, out.seconds, out.pairs, unit=unit,
                            tensor_counts=out.tensor_counts)
    _refuse_unchanged(result)
    result.fingerprint = key
    result.refs = [b.ref.raw] + [a.ref.raw for a in ags]
    result.lineage = lineage
    if folder is not None:
        cache.save(key, result.to_payload(), folder)
        mark("cache entry written")
    return result


def float_tensors(base: Checkpoint) -> int:
    """How many float tensors the pass reads."""
    return sum(1 for e in base.tensors.values() if e.dtype in FLOAT_CODES)


def size_note(base: Checkpoint, n_agents: int, ladder: Sequence[float]) -> str | None:
    """One line said before a pass over a model of very many float tensors: its statistics are kept per group of
    tensors with the same place in the model (layer × module × expert), not per tensor, and how many rows."""
    tensors = float_tensors(base)
    if tensors <= MANY_TENSORS:
        return None
    from merging.reading.structure import structure_of

    st = structure_of(base.tensors)  # the pass asks for the same (remembered)
    floats = [i for i, n in enumerate(st.names) if base.tensors[n].dtype in FLOAT_CODES]
    cols = {c: v[floats] for c, v in st.columns().items()}
    groups = len(set(zip(*(cols[c].tolist() for c in GROUP_COLUMNS))))
    rows = groups * len(ladder) * (n_agents + n_agents * (n_agents - 1) // 2)
    return (f"{tensors:,} float tensors: the analysis keeps its statistics per group of tensors with the same place "
            f"in the model (layer × module × expert: {groups:,} groups, {rows:,} rows), not per tensor; tensor-scope "
            "ρ still uses each tensor's own counts.")


def cached_result(base: str, agents: Sequence[str], policy: str = "error",
                  download: bool = True) -> AnalysisResult | None:
    """A cached analysis of these inputs (default ladder), or None: lets a merge reuse its counts and record
    its diagnostics without reading the weights again (without `download`, models not on disk give None)."""
    try:
        b, ags = _open_all(base, agents, download)
        payload = cache.load(cache.fingerprint(b, ags, validate_ladder(DEFAULT_LADDER), policy))
        return AnalysisResult.from_payload(payload, "") if payload else None
    except (RamStudioError, KeyError, ValueError, TypeError):
        return None


def _refuse_unchanged(result: AnalysisResult) -> None:
    """An agent that changed nothing (at the smallest ε) is almost surely a wrong path: say so."""
    eps0 = result.ladder[0]
    changed = result.frame[result.frame["eps"] == eps0].groupby("agent")["changed"].sum()
    idle = [a for a in result.agents if int(changed.get(a, 0)) == 0]
    if idle:
        raise RamStudioError(
            f"agent {', '.join(idle)} is identical to the base (no parameter differs by more than "
            f"{'ε=' + format(eps0, 'g') if result.unit == 'abs' else format(eps0, 'g') + ' steps'}).",
            "Check the paths: an agent must be a fine-tuned model, not a copy of the base.")

"""The analysis pass: one streaming read of base + agents → tidy per-agent × tensor × ε statistics."""
from __future__ import annotations

import importlib
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch

from merging.reading.checkpoint import Checkpoint, open_checkpoint
from merging.reading.prepare import prepare_inputs
from merging.common.device import gpu_style, pick_device
from merging.common.dtypes import FLOAT_CODES
from merging.passes import ProgressFn, check_finite, float_chunks, locate_nonfinite, uses_kernels
from merging.common.errors import RamStudioError
from merging.reading.fingerprint import Fingerprinter, refuse_identical_agents
from merging.recipe import check_agent_count
from merging.reading.chunks import DEFAULT_CHUNK_ELEMS

from . import cache
from .ladder import DEFAULT_LADDER, DOMINANCE, OverlapAccumulator, Pending, overlap_accumulator, pairs
from .ladder_check import MAX_LADDER, validate_ladder  # noqa: F401 (re-exported: the CLI checks a ladder early)
from merging.reading.structure import Structure, structure_of

if TYPE_CHECKING:  # pandas is imported where a frame is built: not before the pass starts reading
    import pandas as pd

DOMINATED_COLUMNS = [f"dominated_{round(100 * f)}" for f in DOMINANCE]  # Σ τ_t² where partners' Σ|τ| < f·|τ_t|
STAT_COLUMNS = ["changed", "shared", "unique", "norm_unique", "norm_shared", "sign_conflicts", "dot_others",
                "sq_others", *DOMINATED_COLUMNS]
PAIR_COLUMNS = ["both_changed", "same_sign", "dot", "sq_a", "sq_b"]
# The number format's view (analysis.precision): per agent × tensor × ε; changed_any is the same at every ε,
# eps_below_step the same for every agent.
PRECISION_COLUMNS = ["changed_any", "one_step", "sq_one_step", "chance_unique_binade", "eps_below_step"]
UNITS = ("abs", "steps")  # the ladder holds absolute ε values, or counts of representable steps


@dataclass
class AnalysisResult:
    """Statistics of one base + agents set; `frame` has one row per agent × tensor × ε, `pairs` one row per
    pair of agents (a, b in the order of `agents`) × tensor × ε, on the elements both changed."""

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
        return dataclasses.replace(self, agents=agents, frame=frame, pairs=pairs, refs=list(refs))

    def to_payload(self) -> dict:
        return {"base": self.base, "agents": self.agents, "ladder": list(self.ladder),
                "total_params": self.total_params, "seconds": self.seconds, "refs": self.refs, "unit": self.unit,
                "frame": _split(self.frame), "pairs": _split(self.pairs)}

    @classmethod
    def from_payload(cls, p: dict, fingerprint: str) -> "AnalysisResult":
        import pandas as pd

        f, q = p["frame"], p["pairs"]
        frame = pd.DataFrame(f["data"], columns=f["columns"])
        pair_frame = pd.DataFrame(q["data"], columns=q["columns"])
        if not {"agent", "tensor", "eps", *STAT_COLUMNS, *PRECISION_COLUMNS} <= set(frame.columns) or frame.empty:
            raise ValueError("incomplete cached frame")
        if not {"a", "b", "tensor", "eps", *PAIR_COLUMNS} <= set(pair_frame.columns) and len(p["agents"]) > 1:
            raise ValueError("incomplete cached pair frame")
        if p.get("unit", "abs") not in UNITS:
            raise ValueError("unknown unit")
        return cls(p["base"], list(p["agents"]), tuple(p["ladder"]), int(p["total_params"]), frame,
                   float(p["seconds"]), pair_frame, fingerprint, True, list(p.get("refs", [])),
                   unit=p.get("unit", "abs"))


def _split(frame: pd.DataFrame) -> dict:
    """`frame.to_dict(orient="split", index=False)`, the same Python values, built column by column (pandas
    boxes every cell on its own: ~0.2 s for a 0.5B model's statistics)."""
    columns = list(frame.columns)
    return {"columns": columns, "data": [list(row) for row in zip(*(frame[c].tolist() for c in columns))]}


def _open_all(base: Checkpoint | str, agents: Sequence[Checkpoint | str]) -> tuple[Checkpoint, list[Checkpoint]]:
    b = base if isinstance(base, Checkpoint) else open_checkpoint(base)
    return b, [a if isinstance(a, Checkpoint) else open_checkpoint(a) for a in agents]


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
    result = _run_pass(b, ags, labels, ladder, pick_device(device), chunk_elems, progress, cancel, unit)
    result.fingerprint = key
    result.refs = [b.ref.raw] + [a.ref.raw for a in ags]
    result.lineage = lineage
    if folder is not None:
        cache.save(key, result.to_payload(), folder)
    return result


MANY_TENSORS = 20_000  # above this many float tensors the analysis says its per-tensor cost before it starts
BYTES_PER_ROW = 900  # peak memory per frame row, measured (tests/benchmarks/many_tensors.py: 0.56–0.93 KB)


def size_note(base: Checkpoint, n_agents: int, ladder: Sequence[float]) -> str | None:
    """One line said before a pass over a model of very many float tensors (statistics are kept per tensor,
    ε and agent/pair, so their count sets the memory and much of the time, whatever the tensors' size)."""
    tensors = sum(1 for e in base.tensors.values() if e.dtype in FLOAT_CODES)
    if tensors <= MANY_TENSORS:
        return None
    rows = tensors * len(ladder) * (n_agents + n_agents * (n_agents - 1) // 2)
    return (f"{tensors:,} float tensors: the analysis keeps statistics per tensor, ε and agent or pair ({rows:,} rows, "
            f"about {rows * BYTES_PER_ROW / 2**30:.1f} GB at its peak), which takes minutes however small the "
            "tensors are.")


def cached_result(base: str, agents: Sequence[str], policy: str = "error") -> AnalysisResult | None:
    """A cached analysis of these inputs (default ladder), or None: lets a merge reuse its counts and record
    its diagnostics without reading the weights again."""
    try:
        b, ags = _open_all(base, agents)
        payload = cache.load(cache.fingerprint(b, ags, validate_ladder(DEFAULT_LADDER), policy))
        return AnalysisResult.from_payload(payload, "") if payload else None
    except (RamStudioError, KeyError, ValueError, TypeError):
        return None


def _run_pass(base: Checkpoint, agents: list[Checkpoint], labels: list[str], ladder: tuple[float, ...],
              device: torch.device, chunk_elems: int, progress: ProgressFn | None,
              cancel: threading.Event | None, unit: str = "abs") -> AnalysisResult:
    prints = Fingerprinter([base, *agents])
    acc = overlap_accumulator(len(agents), ladder, steps=unit == "steps")
    deferred = gpu_style(device) and not uses_kernels(device)  # a GPU: nothing waits until the end
    batch = max(1, min(64, DECODE_BYTES // acc.pending_nbytes))  # tensors whose statistics are decoded together
    columns: list[tuple[dict, dict]] = []
    pending: list[tuple[str, Pending]] = []
    places = _Places(structure_of(base.tensors))
    start = time.perf_counter()
    chunks = float_chunks(base, agents, phase="analyze", device=device, chunk_elems=chunk_elems, progress=progress,
                          cancel=cancel, fingerprinter=prints, kernels=("overlap_histogram",))
    for i, (data, chunk, last, fused) in enumerate(chunks):
        if i == 0:
            _import_meanwhile("pandas")  # the frame needs it after the pass: 0.3 s, now on a side thread
        dtype = base.tensors[data.span.tensor].dtype
        if deferred:
            acc.add(chunk.taus, chunk.base, dtype, deferred=True)
        elif not _add_chunk(acc, chunk, fused, dtype):
            check_finite(data, chunk.peak_abs_tau(fused), labels, base.label)  # raises, naming where
        if last:
            pending.append((data.span.tensor, acc.take()))
            if not deferred and len(pending) == batch:
                columns.append(_columns(base, labels, ladder, acc, pending, places))
                pending = []
    if any(not p.all_finite() for _, p in pending):
        locate_nonfinite(base, agents, device, chunk_elems)
    for i in range(0, len(pending), batch):
        columns.append(_columns(base, labels, ladder, acc, pending[i:i + batch], places))
    refuse_identical_agents(labels, prints.finish()[1:])
    frame = _frame([c for c, _ in columns])
    pair_frame = _frame([c for _, c in columns], PAIR_FRAME_COLUMNS)
    total = sum(e.numel for e in base.tensors.values() if e.dtype in FLOAT_CODES)
    result = AnalysisResult(base.label, labels, ladder, total, frame, time.perf_counter() - start, pair_frame,
                            unit=unit)
    _refuse_unchanged(result)
    return result


def _add_chunk(acc: OverlapAccumulator, chunk, fused: bool, dtype: str) -> bool:
    """`acc.add_chunk`, with the kernel kept on this thread when the chunk makes one partition (a small
    tensor: waking the thread pool would cost more than the work)."""
    if not fused:
        return acc.add_chunk(chunk, fused, dtype)
    from merging.kernels import one_thread_for
    from merging.kernels.common import hist_parts

    with one_thread_for(hist_parts(chunk.numel)):
        return acc.add_chunk(chunk, fused, dtype)


GROUP_COLUMNS = ["tower", "layer", "module", "expert", "role"]  # where a tensor sits (merging/reading/structure.py)
PAIR_FRAME_COLUMNS = ["a", "b", "tensor", *GROUP_COLUMNS, "numel", "eps", *PAIR_COLUMNS]


class _Places:
    """The base's structure, looked up by tensor name for a batch of tensors."""

    def __init__(self, structure: Structure) -> None:
        self.columns = structure.columns()
        self.index = {n: i for i, n in enumerate(structure.names)}

    def of(self, names: list[str]) -> dict[str, np.ndarray]:
        idx = np.array([self.index[n] for n in names], dtype=np.int64)
        return {c: self.columns[c][idx] for c in GROUP_COLUMNS}


def _frame(parts: list[dict], columns: list[str] | None = None) -> pd.DataFrame:
    """One frame from the batches' columns (lists or object arrays of labels, arrays of numbers), in batch
    order; label columns are passed as lists, so pandas keeps strings and makes the layer column int64 when
    every layer number fits (huge ones stay Python ints)."""
    import pandas as pd

    if not parts:
        return pd.DataFrame(columns=columns)
    cols = {}
    for c, first in parts[0].items():
        if isinstance(first, list) or np.asarray(first).dtype == object:
            cols[c] = [v for part in parts for v in part[c]]
        else:
            cols[c] = np.concatenate([np.asarray(part[c]) for part in parts])
    return pd.DataFrame(cols)


def _import_meanwhile(module: str) -> None:
    """Import `module` on a side thread, so that its import time overlaps the pass; a later `import` waits
    for it to finish, and imports again (raising there, where it is reported) if it failed here."""
    if module not in sys.modules:
        threading.Thread(target=_import_quietly, args=(module,), name=f"ram-import-{module}", daemon=True).start()


def _import_quietly(module: str) -> None:
    try:
        importlib.import_module(module)
    except BaseException:  # noqa: BLE001 - the caller's own import reports it
        pass


DECODE_BYTES = 32 << 20  # at most this much of per-tensor sums is kept for one batched decoding


def _columns(base: Checkpoint, labels: list[str], ladder: tuple[float, ...], acc: OverlapAccumulator,
             batch: list[tuple[str, Pending]], places: _Places
             ) -> tuple[dict[str, list | np.ndarray], dict[str, list | np.ndarray]]:
    """The frames' columns for a batch of tensors: one row per tensor × agent × ε, and one per tensor × pair
    of agents × ε, in that order; each tensor's place (tower, layer, module, expert, role) on its rows."""
    st = acc.results([p for _, p in batch])
    n, L = len(labels), len(ladder)
    per_tensor = n * L
    names = [name for name, _ in batch]

    def per_row(values: list) -> np.ndarray:  # one value per tensor, repeated for its rows (no Python lists)
        return np.repeat(np.array(values + [None], dtype=object)[:-1], per_tensor)

    place = places.of(names)

    cols: dict[str, list | np.ndarray] = {
        "agent": np.tile(np.array([a for a in labels for _ in ladder] + [None], dtype=object)[:-1], len(names)),
        "tensor": per_row(names),
        "tower": np.repeat(place["tower"], per_tensor),
        "layer": per_row([int(v) for v in place["layer"]]),  # objects: a layer number of any size
        "module": np.repeat(place["module"], per_tensor),
        "expert": np.repeat(place["expert"], per_tensor),
        "role": np.repeat(place["role"], per_tensor),
        "numel": np.repeat(np.array([base.tensors[x].numel for x in names], dtype=np.int64), per_tensor),
        "eps": np.tile(np.array(ladder, dtype=np.float64), len(names) * n),
        "changed": st.changed.reshape(-1).numpy(), "shared": st.shared.reshape(-1).numpy(),
        "unique": st.unique.reshape(-1).numpy(),
        "norm_unique": st.sq_unique.reshape(-1).sqrt().numpy(), "norm_shared": st.sq_shared.reshape(-1).sqrt().numpy(),
        "sign_conflicts": st.conflicts.reshape(-1).numpy(),
        "dot_others": st.dot_others.reshape(-1).numpy(), "sq_others": st.sq_others.reshape(-1).numpy()}
    dominated = st.dominated.reshape(-1, len(DOMINANCE)).numpy()
    for f, name in enumerate(DOMINATED_COLUMNS):
        cols[name] = dominated[:, f]
    hist = st.hist.reshape(-1, n).numpy()
    for k in range(n):
        cols[f"k{k + 1}"] = hist[:, k]
    cols.update(_precision_columns(st.precision, n))
    pair_list = pairs(n)
    per_pair = len(pair_list) * L
    layers = cols["layer"][::per_tensor] if per_tensor else []
    pair_cols: dict[str, list | np.ndarray] = {
        "a": [labels[a] for _ in names for a, _ in pair_list for _ in ladder],
        "b": [labels[b] for _ in names for _, b in pair_list for _ in ladder],
        "tensor": [name for name in names for _ in range(per_pair)],
        "tower": np.repeat(place["tower"], per_pair),
        "layer": [v for v in layers for _ in range(per_pair)],
        "module": np.repeat(place["module"], per_pair),
        "expert": np.repeat(place["expert"], per_pair),
        "role": np.repeat(place["role"], per_pair),
        "numel": np.repeat(cols["numel"][::per_tensor], per_pair) if per_tensor else np.zeros(0, np.int64),
        "eps": np.tile(np.array(ladder, dtype=np.float64), len(names) * len(pair_list)),
        "both_changed": st.pair_both.reshape(-1).numpy(), "same_sign": st.pair_agree.reshape(-1).numpy(),
        "dot": st.pair_dot.reshape(-1).numpy(), "sq_a": st.pair_sq_a.reshape(-1).numpy(),
        "sq_b": st.pair_sq_b.reshape(-1).numpy()}
    return cols, pair_cols


def _precision_columns(pr, n: int) -> dict[str, np.ndarray]:
    """The precision statistics as frame columns, rows in the frame's order (tensor, agent, ε)."""
    cols = {c: getattr(pr, c).reshape(-1).numpy() for c in PRECISION_COLUMNS if c != "eps_below_step"}
    below = pr.eps_below_step  # (T, L): the same for every agent
    cols["eps_below_step"] = below.unsqueeze(1).expand(below.shape[0], n, below.shape[1]).reshape(-1).numpy()
    return cols


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

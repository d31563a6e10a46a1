"""Where the analysis pass keeps its statistics: numpy arrays with one row per unit, a unit being one tensor, or —
for models of very many tensors (MoE checkpoints store every expert's projections apart) — one group of
tensors with the same place in the model (tower × layer × module × expert × role, merging/reading/structure.py).

Every statistic the frames hold is a sum over elements, so a group's row is the sum of its tensors' rows:
the charts and tables, which sum rows per agent, layer, module or expert, show the same numbers either way.
The statistics that are not sums over elements are made into sums per tensor before they are added: the
unique count independent masks of each tensor's own densities would give (`chance_unique_tensor`), each pair's
expected elements both changed under such masks (`expected_both_tensor`); and each tensor's shared and unique
counts, which tensor-scope ρ needs, are kept per tensor (`TensorCounts`, grouped units only). The frames are
built once, column by column, from these arrays (no Python object per row).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from merging.reading.structure import Structure

from .ladder import DOMINANCE

if TYPE_CHECKING:
    import pandas as pd

DOMINATED = [f"dominated_{round(100 * f)}" for f in DOMINANCE]
# Sums per agent × unit × ε, in the frame's column order (hist columns k1…kN and the derived ones follow).
AGENT_SUMS = ["changed", "shared", "unique", "sq_unique", "sq_shared", "sign_conflicts", "dot_others", "sq_others",
              *DOMINATED]
PRECISION_SUMS = ["changed_any", "one_step", "sq_one_step", "chance_unique_binade"]
PAIR_SUMS = ["both_changed", "same_sign", "dot", "sq_a", "sq_b"]
GROUP_COLUMNS = ["tower", "layer", "module", "expert", "role"]
MANY_TENSORS = 20_000  # above this many float tensors, rows are groups of tensors (the analysis decides it, stats.py)


@dataclass
class TensorBatch:
    """Statistics of T tensors: `agent` arrays (T, N, L), `pair` arrays (T, P, L), `below` (T, L) (elements whose
    step exceeds ε), `finite` (T,) (every τ finite)."""

    agent: dict[str, np.ndarray]
    pair: dict[str, np.ndarray]
    below: np.ndarray
    finite: np.ndarray | None = None

    def with_chance(self, numel: np.ndarray) -> "TensorBatch":
        """Add each tensor's chance values (sums over tensors, see the module docstring)."""
        c = self.agent["changed"].astype(np.float64)  # (T, N, L)
        size = numel.astype(np.float64).reshape(-1, 1, 1)
        d = np.divide(c, size, out=np.zeros_like(c), where=size > 0)
        n = c.shape[1]
        chance = np.empty_like(c)
        for t in range(n):
            keep = np.ones_like(c[:, 0])
            for s in range(n):
                if s != t:
                    keep = keep * (1.0 - d[:, s])
            chance[:, t] = c[:, t] * keep
        self.agent["chance_unique_tensor"] = chance
        pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
        both = np.zeros((c.shape[0], len(pairs), c.shape[2]))
        for p, (a, b) in enumerate(pairs):
            both[:, p] = np.divide(c[:, a] * c[:, b], size[:, 0], out=np.zeros_like(c[:, a]), where=size[:, 0] > 0)
        self.pair["expected_both_tensor"] = both
        return self


def batch_from_stats(st) -> TensorBatch:
    """A TensorBatch from analysis.ladder.TensorStats with a leading tensor axis (the histogram path)."""
    n = st.changed.shape[1]
    agent = {"changed": st.changed, "shared": st.shared, "unique": st.unique, "sq_unique": st.sq_unique,
             "sq_shared": st.sq_shared, "sign_conflicts": st.conflicts, "dot_others": st.dot_others,
             "sq_others": st.sq_others}
    agent = {k: v.numpy() for k, v in agent.items()}
    dom = st.dominated.numpy()
    for f, name in enumerate(DOMINATED):
        agent[name] = dom[..., f]
    hist = st.hist.numpy()
    for k in range(n):
        agent[f"k{k + 1}"] = hist[..., k]
    pr = st.precision
    for name in PRECISION_SUMS:
        agent[name] = getattr(pr, name).numpy()
    pair = {"both_changed": st.pair_both, "same_sign": st.pair_agree, "dot": st.pair_dot, "sq_a": st.pair_sq_a,
            "sq_b": st.pair_sq_b}
    return TensorBatch(agent, {k: v.numpy() for k, v in pair.items()}, pr.eps_below_step.numpy())


@dataclass
class Units:
    """The rows' units: for each unit its label (the tensor's name, or for a group the names' common pattern),
    place, element and tensor counts; `of_tensor` maps each tensor (in pass order) to its unit."""

    labels: np.ndarray  # object (U,)
    places: dict[str, np.ndarray]  # GROUP_COLUMNS → (U,)
    numel: np.ndarray  # int64 (U,)
    tensors: np.ndarray  # int64 (U,)
    of_tensor: np.ndarray  # int64 (T,)
    grouped: bool
    names: list[str] = field(default_factory=list)  # the tensors, in pass order


def plan_units(names: list[str], structure: Structure, numel: np.ndarray, grouped: bool | None = None) -> Units:
    """One unit per tensor, or (`grouped`; by default above MANY_TENSORS tensors) one per place in the model."""
    grouped = len(names) > MANY_TENSORS if grouped is None else grouped
    index = {n: i for i, n in enumerate(structure.names)}
    rows = np.array([index[n] for n in names], dtype=np.int64)
    cols = {c: v[rows] for c, v in structure.columns().items()}
    if not grouped:
        return Units(_objects(names), cols, numel.astype(np.int64), np.ones(len(names), np.int64),
                     np.arange(len(names), dtype=np.int64), False, list(names))
    keys = list(zip(*(cols[c].tolist() for c in GROUP_COLUMNS)))
    first: dict[tuple, int] = {}
    of_tensor = np.array([first.setdefault(k, len(first)) for k in keys], dtype=np.int64)
    U = len(first)
    starts = np.zeros(U, np.int64)
    starts[of_tensor[::-1]] = np.arange(len(names) - 1, -1, -1)  # each unit's first tensor
    members: list[list[str]] = [[] for _ in range(U)]
    for name, u in zip(names, of_tensor.tolist()):
        members[u].append(name)
    labels = _unique_labels([pattern(m) for m in members])
    return Units(_objects(labels), {c: v[starts] for c, v in cols.items()},
                 np.bincount(of_tensor, weights=numel, minlength=U).astype(np.int64),
                 np.bincount(of_tensor, minlength=U).astype(np.int64), of_tensor, True, list(names))


def pattern(names: list[str]) -> str:
    """A group's label: its one name, or the names' common start and end around a `*`
    (model.layers.3.mlp.experts.*.weight)."""
    if len(names) == 1:
        return names[0]
    head = os.path.commonprefix(names)
    tails = [n[len(head):] for n in names]
    tail = os.path.commonprefix([t[::-1] for t in tails])[::-1]
    return f"{head}*{tail}"


def _unique_labels(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        k = seen.get(label, 0)
        seen[label] = k + 1
        out.append(label if k == 0 else f"{label} ({k + 1})")
    return out


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


@dataclass
class TensorCounts:
    """Each tensor's shared and unique counts (T, N, L), kept when units are groups: tensor-scope ρ and λ are
    per tensor. `unit` maps each tensor to its unit, labelled `unit_labels[unit]` in the frames."""

    names: list[str]
    unit: np.ndarray
    shared: np.ndarray
    unique: np.ndarray
    unit_labels: list[str]

    def labels(self) -> np.ndarray:
        """Each tensor's unit label."""
        return _objects(self.unit_labels)[self.unit]


class UnitSums:
    """Per-unit sums, filled batch by batch (`add`), turned into the two frames (`frames`)."""

    def __init__(self, units: Units, n: int, L: int) -> None:
        self.units, self.n, self.L = units, n, L
        U, P = len(units.labels), n * (n - 1) // 2
        names = [*AGENT_SUMS, *(f"k{k + 1}" for k in range(n)), *PRECISION_SUMS, "chance_unique_tensor"]
        self.agent = {c: np.zeros((U, n, L), _dtype(c)) for c in names}
        self.pair = {c: np.zeros((U, P, L), _dtype(c)) for c in [*PAIR_SUMS, "expected_both_tensor"]}
        self.below = np.zeros((U, L), np.int64)
        T = len(units.of_tensor)
        self.counts = TensorCounts(units.names, units.of_tensor, np.zeros((T, n, L), np.int64),
                                   np.zeros((T, n, L), np.int64), units.labels.tolist()) if units.grouped else None

    def add(self, tensors: np.ndarray, batch: TensorBatch) -> None:
        """Add the statistics of the tensors at these positions (in pass order)."""
        if self.counts is not None:
            self.counts.shared[tensors] = batch.agent["shared"]
            self.counts.unique[tensors] = batch.agent["unique"]
        units = self.units.of_tensor[tensors]
        if not self.units.grouped:
            for c, arr in self.agent.items():
                arr[units] = batch.agent[c]
            for c, arr in self.pair.items():
                arr[units] = batch.pair[c]
            self.below[units] = batch.below
            return
        order = np.argsort(units, kind="stable")
        sorted_units = units[order]
        cuts = np.flatnonzero(np.r_[True, sorted_units[1:] != sorted_units[:-1]])
        target = sorted_units[cuts]
        for store, source in ((self.agent, batch.agent), (self.pair, batch.pair)):
            for c, arr in store.items():
                arr[target] += np.add.reduceat(source[c][order], cuts, axis=0)
        self.below[target] += np.add.reduceat(batch.below[order], cuts, axis=0)

    def frames(self, labels: list[str], ladder: tuple[float, ...]) -> tuple["pd.DataFrame", "pd.DataFrame"]:
        """The per-agent frame (one row per unit × agent × ε) and the pair frame (unit × pair × ε)."""
        import pandas as pd

        n, L, u = self.n, self.L, self.units
        U = len(u.labels)
        agents = _objects(list(labels))
        cols = {"agent": np.tile(np.repeat(agents, L), U), **_keys(u, n * L), "eps": np.tile(np.array(ladder), U * n)}
        a = self.agent
        for c in AGENT_SUMS:
            if c in ("sq_unique", "sq_shared"):
                cols["norm_" + c[3:]] = np.sqrt(a[c]).reshape(-1)
            else:
                cols[c] = a[c].reshape(-1)
        for k in range(n):
            cols[f"k{k + 1}"] = a[f"k{k + 1}"].reshape(-1)
        for c in PRECISION_SUMS:
            cols[c] = a[c].reshape(-1)
        cols["eps_below_step"] = np.broadcast_to(self.below[:, None, :], (U, n, L)).reshape(-1)
        cols["chance_unique_tensor"] = a["chance_unique_tensor"].reshape(-1)
        cols["tensors"] = np.repeat(u.tensors, n * L)
        frame = pd.DataFrame(cols, copy=False)  # the columns are views of these arrays: no second copy
        pairs = [(x, y) for x in range(n) for y in range(x + 1, n)]
        P = len(pairs)
        pcols = {"a": np.tile(np.repeat(_objects([labels[x] for x, _ in pairs]), L), U),
                 "b": np.tile(np.repeat(_objects([labels[y] for _, y in pairs]), L), U),
                 **_keys(u, P * L), "eps": np.tile(np.array(ladder), U * P)}
        for c, arr in self.pair.items():
            pcols[c] = arr.reshape(-1)
        pcols["tensors"] = np.repeat(u.tensors, P * L)
        return frame, pd.DataFrame(pcols, copy=False)


def _dtype(column: str):
    floats = ("sq_", "norm_", "dot", "dominated", "chance", "expected")
    return np.float64 if column.startswith(floats) else np.int64


def _keys(u: Units, per: int) -> dict[str, np.ndarray]:
    """The unit columns (tensor label, place, numel), each value repeated for the unit's `per` rows."""
    cols = {"tensor": np.repeat(u.labels, per)}
    for c in GROUP_COLUMNS:
        cols[c] = np.repeat(u.places[c], per)
    cols["numel"] = np.repeat(u.numel, per)
    return cols

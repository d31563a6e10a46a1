"""Overlap statistics of one tensor for a whole ladder of ε values in a single pass over its chunks.

Each |τ_t| is bucketed once into the ladder (b = number of ladder values below it, so m_t(ε_j) is
b_t > j); with the sign of τ_t, each element's joint state over the N agents has (2·(L+1))^N values.
One histogram of joint states (plus one weighted by τ_t² per agent, and one by τ_a·τ_b per pair of
agents) then gives, for every ε at once, changed/shared/unique counts, the overlap histogram, L2 norms of
unique and shared parts, sign conflicts, and the shared-region diagnostics: per pair of agents the
elements both changed, how many of them agree in sign, and the cosine of the two updates there; per
agent the cosine against the other active agents' combined update. For many agents or long ladders the
state space explodes, so beyond `joint_fits` it loops over ε instead. The two strategies are two classes,
`JointHistogramAccumulator` and `EpsLoopAccumulator`, behind one interface (`OverlapAccumulator`);
`overlap_accumulator` chooses once per analysis.

The dominance profile (how much of an agent's shared-region energy Σ τ_t² sits where the other active
agents' combined |τ| is below 10 % or 30 % of its own) needs a per-element comparison of magnitudes that
the buckets cannot give. As ε grows, agents drop out of an element one by one, so for each element the
ε indices where the condition holds form one interval [start, end): start is the first index at which the
active partners' Σ|τ| falls below the fraction of |τ_t| (it only falls as ε grows), end the first index at
which t or all its partners are inactive. τ_t² is added to a small (start, end) table, which decodes
exactly into every ε; the per-ε loop evaluates the same rule at each ε directly.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from merging.methods import regions

from .joint_states import bincount, decode_diagnostics, decode_tables, dominance_tables
from .precision import PrecisionStats, decode, empty_table, format_tables, precision_table, step_buckets, table_width

JOINT_MAX_AGENTS = 4
DOMINANCE = (0.1, 0.3)  # partners' combined |τ| below these fractions of the agent's own |τ|
SLICE = 1 << 21  # elements the torch path handles at once (its float64 copies of τ: N × 16 MB)
JOINT_MAX_TABLE_BYTES = 128 << 20  # the joint decoding tables (states × N × L × N float64) stay below this
DEFAULT_LADDER = (0.0, 1e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 1e-3)
STEP_LADDER = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # analyze --eps-steps: representable steps of the stored dtype

@dataclass
class TensorStats:
    """Per-agent, per-ε statistics of one tensor; arrays are (N, L) unless noted (`results` gives each a
    leading tensor axis)."""

    changed: torch.Tensor
    shared: torch.Tensor
    unique: torch.Tensor
    hist: torch.Tensor  # (N, L, N): hist[t, j, k-1] = elements changed by t and by exactly k agents
    sq_unique: torch.Tensor  # Σ τ_t² over t's unique elements (float64)
    sq_shared: torch.Tensor
    conflicts: torch.Tensor  # t's shared elements where another active agent has the opposite sign
    # per pair (a, b) of `pairs(N)`, on the elements both changed; arrays are (P, L)
    pair_both: torch.Tensor  # elements both changed
    pair_agree: torch.Tensor  # …of which τ_a and τ_b have the same sign
    pair_dot: torch.Tensor  # Σ τ_a·τ_b (float64)
    pair_sq_a: torch.Tensor  # Σ τ_a²
    pair_sq_b: torch.Tensor  # Σ τ_b²
    # per agent t over its shared elements, against o_t = Σ of the other active agents' τ (float64, (N, L))
    dot_others: torch.Tensor  # Σ τ_t·o_t
    sq_others: torch.Tensor  # Σ o_t²
    dominated: torch.Tensor  # (N, L, len(DOMINANCE)): Σ τ_t² where Σ_{other active} |τ| < f·|τ_t|
    precision: PrecisionStats | None = None  # analysis.precision: the number format's view of "changed"


STAT_FIELDS = tuple(f for f in TensorStats.__dataclass_fields__ if f != "precision")


def pairs(n: int) -> list[tuple[int, int]]:
    """The agent pairs (a, b), a < b, in the order the pair statistics use."""
    return [(a, b) for a in range(n) for b in range(a + 1, n)]


def overlap_accumulator(n_agents: int, ladder: tuple[float, ...] = DEFAULT_LADDER,
                        steps: bool = False) -> OverlapAccumulator:
    """The strategy for `n_agents` and this ladder (of ε values, or of step counts with `steps`): the joint-state
    histogram when `joint_fits`, else the ε loop."""
    if joint_fits(n_agents, len(ladder)):
        return JointHistogramAccumulator(n_agents, ladder, steps)
    return EpsLoopAccumulator(n_agents, ladder, steps)


class OverlapAccumulator(ABC):
    """Accumulates one tensor's statistics chunk by chunk: `add` (or `add_chunk`) each chunk, `take` the sums
    when the tensor ends, decode them with `results` (or `result`). Two strategies implement `_zero`,
    `_add_slice`, `_sums`, `pending_nbytes` and `results`; `overlap_accumulator` picks one. With `steps` the
    ladder counts representable steps of each tensor's stored dtype at the base weight (merging.methods.steps)
    instead of absolute ε values; both strategies also fill the precision table (analysis.precision)."""

    def __init__(self, n_agents: int, ladder: tuple[float, ...] = DEFAULT_LADDER, steps: bool = False) -> None:
        if list(ladder) != sorted(set(ladder)):
            raise ValueError("the ε ladder must be strictly increasing")
        self.n = n_agents
        self.steps = steps
        self.ladder = tuple(float(e) for e in ladder)
        self.pairs = pairs(n_agents)
        self._ladder_t = torch.tensor(self.ladder, dtype=torch.float32)
        self._reset()

    def _reset(self, device: torch.device | str = "cpu") -> None:
        self._device = torch.device(device)
        self._finite: torch.Tensor | None = None
        self._prec = empty_table(self.n, len(self.ladder), device)
        self._dtype: str | None = None
        self._zero(device)

    @abstractmethod
    def _zero(self, device: torch.device | str) -> None:
        """Zeroed sums on `device`."""

    @abstractmethod
    def _add_slice(self, taus: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Add a slice of task vectors (N, E) with their ladder buckets `b`; return its Σ τ² (float64, 0-dim:
        not finite when the slice held NaN or Inf)."""

    @abstractmethod
    def _sums(self) -> tuple:
        """The sums as they are, for `take`."""

    @property
    @abstractmethod
    def pending_nbytes(self) -> int:
        """What one `take`n tensor's sums hold, in bytes (what keeping several for `results` costs)."""

    @abstractmethod
    def results(self, pendings: Sequence["Pending"]) -> TensorStats:
        """The statistics of one or more `take`n tensors at once, each array with a leading tensor axis."""

    def _on(self, device: torch.device, dtype: str) -> None:
        """Keep the sums on the device the task vectors are on (reset while nothing is summed yet); note the
        tensor's stored dtype."""
        if device != self._device:
            if self._finite is not None or self._dtype is not None:
                raise RuntimeError("one tensor's chunks came from two devices")
            self._reset(device)
        if self._dtype not in (None, dtype):
            raise RuntimeError("one tensor's chunks came with two dtypes")
        self._dtype = dtype

    def _format(self, dtype: str):
        return format_tables(dtype, self.ladder, self.steps)

    def add_chunk(self, chunk, fused: bool, dtype: str) -> bool:
        """Add a chunk given as merging.reading.chunk_inputs.ChunkInputs of a base tensor stored in `dtype`
        (the torch path: its task vectors and base)."""
        return self.add(chunk.taus, chunk.base, dtype)

    def add(self, taus: torch.Tensor, base: torch.Tensor, dtype: str, deferred: bool = False) -> bool:
        """Add a chunk of task vectors (N, E) and its base weights (E,), float32 on any device, of a base tensor
        stored in `dtype` (a safetensors code); False if it held NaN or Inf.

        NaN and ±Inf sort above every ladder value, so they land in the squared sums and show there.
        The sums stay on the task vectors' device. With `deferred`, nothing waits for that device: the
        finite check is kept there too (see `take`), and True is returned.
        """
        if taus.shape[1] == 0:
            return True
        self._on(taus.device, dtype)
        ladder = self._ladder_t.to(taus.device)
        ft, L = self._format(dtype), len(self.ladder)
        chunk_finite = None
        for lo in range(0, taus.shape[1], SLICE):  # float64 working copies stay a few (N, SLICE) arrays
            part, bpart = taus[:, lo:lo + SLICE], base[lo:lo + SLICE]
            mag = part.abs().contiguous()
            # number of ladder values < |τ| (in steps: of the ladder's thresholds at each base weight)
            b = step_buckets(mag, bpart, ft, L) if self.steps else torch.searchsorted(ladder, mag)
            self._prec += precision_table(part, bpart, b, ft, L)
            sq = self._add_slice(part, b)
            finite = torch.isfinite(sq)
            chunk_finite = finite if chunk_finite is None else chunk_finite & finite
        self._finite = chunk_finite if self._finite is None else self._finite & chunk_finite
        return True if deferred else bool(chunk_finite)

    def take(self) -> "Pending":
        """This tensor's sums as they are (on their device; nothing waits for it), and a reset."""
        pending = Pending(self._sums(), self._finite, self._prec, self._dtype or "F32")
        self._reset(self._device)
        return pending

    def result(self, pending: "Pending | None" = None) -> TensorStats:
        """The statistics of the tensor summed so far (or of a `take`n one); resets."""
        batch = self.results([pending if pending is not None else self.take()])
        return TensorStats(*(getattr(batch, f)[0] for f in STAT_FIELDS), batch.precision.at(0))

    def _precision(self, pendings: Sequence["Pending"]) -> PrecisionStats:
        """The precision statistics of `take`n tensors."""
        return decode([p.prec for p in pendings], [self._format(p.dtype) for p in pendings], self.ladder, self.steps)


class JointHistogramAccumulator(OverlapAccumulator):
    """Few agents and a short ladder: one histogram of joint states (and Σ τ_t², Σ τ_a·τ_b per state), decoded
    into every ε at once; the fused kernel bins chunks without torch."""

    def __init__(self, n_agents: int, ladder: tuple[float, ...] = DEFAULT_LADDER, steps: bool = False) -> None:
        self._tables = decode_tables(n_agents, len(ladder))
        super().__init__(n_agents, ladder, steps)

    def _zero(self, device: torch.device | str) -> None:
        n, L, P, F = self.n, len(self.ladder), len(self.pairs), len(DOMINANCE)
        f64 = {"dtype": torch.float64, "device": device}
        states = self._tables["states"]
        self._counts = torch.zeros(states, **f64)
        self._sq = torch.zeros(n, states, **f64)
        self._prod = torch.zeros(P, states, **f64)
        self._dom = torch.zeros(n, F, (L + 1) ** 2, **f64)

    def add_chunk(self, chunk, fused: bool, dtype: str) -> bool:
        """Add a chunk given as merging.reading.chunk_inputs.ChunkInputs of a base tensor stored in `dtype`;
        `fused` bins it with the numba kernel."""
        if not fused:
            return self.add(chunk.taus, chunk.base, dtype)
        from merging.kernels.common import hist_parts
        from merging.kernels.statistics import overlap_histogram

        base, agents = chunk.raw()
        if base.size == 0:
            return True
        self._on(torch.device("cpu"), dtype)
        ft = self._format(dtype)
        counts, sq, prod, dom, prec = overlap_histogram(
            base, agents, self._ladder_t.numpy(), np.array(DOMINANCE), hist_parts(base.size), self.steps, ft.thr,
            ft.binmap, ft.step32, ft.min_field)
        self._prec += torch.from_numpy(prec)
        self._counts += torch.from_numpy(counts).double()
        sq_t = torch.from_numpy(sq)
        self._sq += sq_t
        self._prod += torch.from_numpy(prod)
        self._dom += torch.from_numpy(dom)
        return bool(torch.isfinite(sq_t.sum()))

    def _add_slice(self, taus: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Bin the slice's joint states: counts, Σ τ_t² per agent and Σ τ_a·τ_b per pair; the dominance table."""
        n, s = self.n, 2 * (len(self.ladder) + 1)
        code = torch.zeros(taus.shape[1], dtype=torch.int64, device=taus.device)
        for t in range(n):
            code += (b[t] * 2 + (taus[t] > 0)) * (s ** t)
        states = self._tables["states"]
        self._counts += bincount(code, states).double()
        wide = taus.double()
        sq = torch.stack([bincount(code, states, wide[t].square()) for t in range(n)])
        self._sq += sq
        for p, (a, c) in enumerate(self.pairs):
            self._prod[p] += bincount(code, states, wide[a] * wide[c])
        self._dom += dominance_tables(wide, b, len(self.ladder), DOMINANCE)
        return sq.sum()

    @property
    def pending_nbytes(self) -> int:
        """What one `take`n tensor's sums hold, in bytes."""
        n, L, P, F = self.n, len(self.ladder), len(self.pairs), len(DOMINANCE)
        return ((1 + n + P) * self._tables["states"] + n * F * (L + 1) ** 2 + n * table_width(L)) * 8

    def _sums(self) -> tuple:
        return (self._counts, self._sq, self._prod, self._dom)

    def results(self, pendings: Sequence["Pending"]) -> TensorStats:
        """The statistics of one or more `take`n tensors at once, each array with a leading tensor axis:
        one matrix product per table for the whole batch instead of a dozen small operations per tensor."""
        n, L = self.n, len(self.ladder)
        sums = [tuple(t.cpu() for t in p.sums) for p in pendings]
        tb, T = self._tables, len(sums)
        counts = torch.stack([s[0] for s in sums])  # (T, states)
        # Only the joint states that occur are decoded (few in small tensors: a tensor of 30 elements has at most
        # 30 of the 18³ states of 3 agents); every sum is zero in the others.
        used = (counts.sum(0) != 0).nonzero().squeeze(1)
        if not len(used):  # only empty tensors: one state, all zero
            used = torch.zeros(1, dtype=torch.int64)
        counts, states = counts[:, used], len(used)

        def per(ind: torch.Tensor, *shape: int) -> torch.Tensor:  # (states, N, L, …) indicator → counts
            return (counts @ ind[used].reshape(states, -1)).reshape(T, *shape).round().to(torch.int64)

        sq = torch.stack([s[1] for s in sums])[..., used]  # (T, N, used states)
        def own(ind: torch.Tensor) -> torch.Tensor:  # Σ_s sq[u, t, s]·ind[s, t, j] → (T, N, L)
            return torch.stack([sq[:, t] @ ind[:, t] for t in range(n)], 1)

        sq_unique, sq_shared = own(tb["unique"][used]), own(tb["shared"][used])
        prod = torch.stack([s[2] for s in sums])[..., used]  # (T, P, used states)
        dom = torch.stack([s[3] for s in sums])  # (T, N, F, (L+1)²)
        diag = decode_diagnostics(tb, self.pairs, L, counts, sq, prod, dom, tb["digits"][used])
        return TensorStats(per(tb["active"], n, L), per(tb["shared"], n, L), per(tb["unique"], n, L),
                           per(tb["hist"], n, L, n), sq_unique, sq_shared, per(tb["conflict"], n, L), *diag,
                           self._precision(pendings))


class EpsLoopAccumulator(OverlapAccumulator):
    """Many agents or a long ladder (the joint state space would explode): the rule evaluated at each ε of the
    ladder in turn, every statistic summed directly into a `TensorStats` of (N, L) arrays."""

    def _zero(self, device: torch.device | str) -> None:
        n, L, P, F = self.n, len(self.ladder), len(self.pairs), len(DOMINANCE)
        f64 = {"dtype": torch.float64, "device": device}
        i64 = {"dtype": torch.int64, "device": device}
        self._acc = TensorStats(*(torch.zeros(n, L, **i64) for _ in range(3)), torch.zeros(n, L, n, **i64),
                                torch.zeros(n, L, **f64), torch.zeros(n, L, **f64), torch.zeros(n, L, **i64),
                                torch.zeros(P, L, **i64), torch.zeros(P, L, **i64),
                                *(torch.zeros(P, L, **f64) for _ in range(3)),
                                torch.zeros(n, L, **f64), torch.zeros(n, L, **f64), torch.zeros(n, L, F, **f64))

    def _add_slice(self, taus: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Evaluate the rule at each ε of the ladder and add every statistic directly."""
        acc = self._acc
        pos_all, neg_all = taus > 0, taus < 0
        wide = taus.double()
        sq = wide.square()
        mag = wide.abs()
        for j in range(len(self.ladder)):
            m = b > j  # |τ| > ε_j: the rule of Eq. 1 through the ladder buckets
            c, shar, uniq = regions.shared_and_unique(m)
            pos = (m & pos_all).sum(0)
            neg = (m & neg_all).sum(0)
            acc.changed[:, j] += m.sum(1)
            acc.unique[:, j] += uniq.sum(1)
            acc.shared[:, j] += shar.sum(1)
            acc.sq_unique[:, j] += (sq * uniq).sum(1)
            acc.sq_shared[:, j] += (sq * shar).sum(1)
            opposite = torch.where(pos_all, neg > 0, pos > 0)
            acc.conflicts[:, j] += (shar & opposite).sum(1)
            for t in range(self.n):
                acc.hist[t, j] += bincount(torch.where(m[t], c, 0), self.n + 1)[1:]
            for p, (a, b2) in enumerate(self.pairs):
                both = m[a] & m[b2]
                acc.pair_both[p, j] += both.sum()
                acc.pair_agree[p, j] += (both & (pos_all[a] == pos_all[b2])).sum()
                acc.pair_dot[p, j] += (wide[a] * wide[b2] * both).sum()
                acc.pair_sq_a[p, j] += (sq[a] * both).sum()
                acc.pair_sq_b[p, j] += (sq[b2] * both).sum()
            active = torch.where(m, wide, 0.0)
            active_mag = torch.where(m, mag, 0.0)
            for t in range(self.n):
                others = _sum_rows(active, t)  # the other active agents' τ, summed in agent order
                acc.dot_others[t, j] += (wide[t] * others * shar[t]).sum()
                acc.sq_others[t, j] += (others.square() * shar[t]).sum()
                partners = _sum_rows(active_mag, t)
                for f, frac in enumerate(DOMINANCE):
                    acc.dominated[t, j, f] += (sq[t] * (shar[t] & (partners < frac * mag[t]))).sum()
        return sq.sum()

    @property
    def pending_nbytes(self) -> int:
        """What one `take`n tensor's sums hold, in bytes."""
        n, L, P, F = self.n, len(self.ladder), len(self.pairs), len(DOMINANCE)
        return ((6 + n) * n * L + 5 * P * L + (2 + F) * n * L + n * table_width(L)) * 8

    def _sums(self) -> tuple:
        return tuple(getattr(self._acc, f) for f in STAT_FIELDS)

    def results(self, pendings: Sequence["Pending"]) -> TensorStats:
        """The statistics of one or more `take`n tensors, stacked on a leading tensor axis."""
        sums = [tuple(t.cpu() for t in p.sums) for p in pendings]
        return TensorStats(*(torch.stack(f) for f in zip(*sums)), self._precision(pendings))


def joint_fits(n_agents: int, ladder_len: int) -> bool:
    """Whether the joint-state histogram is used: few agents and a state space whose decoding tables are
    bounded (a long ladder with 4 agents would need gigabytes; it loops over ε instead)."""
    states = (2 * (ladder_len + 1)) ** n_agents
    return n_agents <= JOINT_MAX_AGENTS and states * n_agents * ladder_len * n_agents * 8 <= JOINT_MAX_TABLE_BYTES


@dataclass
class Pending:
    """One tensor's sums, still on their device, and whether every square was finite (a 0-dim bool
    tensor there, or None when nothing was added through the torch path)."""

    sums: tuple
    finite: torch.Tensor | None
    prec: torch.Tensor  # the precision table (analysis.precision)
    dtype: str  # the base tensor's stored dtype

    def all_finite(self) -> bool:
        return self.finite is None or bool(self.finite)


def _sum_rows(x: torch.Tensor, skip: int) -> torch.Tensor:
    """Σ of the rows of x except `skip`, added in row order from 0 (the kernel's order)."""
    out = torch.zeros_like(x[0])
    for t in range(x.shape[0]):
        if t != skip:
            out = out + x[t]
    return out

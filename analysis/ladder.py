"""Overlap statistics of one tensor for a whole ladder of ε values in a single pass over its chunks.

Each |τ_t| is bucketed once into the ladder (b = number of ladder values below it, so m_t(ε_j) is
b_t > j); with the sign of τ_t, each element's joint state over the N agents has (2·(L+1))^N values.
One histogram of joint states (plus one weighted by τ_t² per agent) then gives, for every ε at once,
changed/shared/unique counts, the overlap histogram, L2 norms of unique and shared parts, and sign
conflicts. For many agents or long ladders the state space explodes, so beyond `joint_fits` it loops
over ε instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from merging import regions

JOINT_MAX_AGENTS = 4
JOINT_MAX_TABLE_BYTES = 128 << 20  # the joint decoding tables (states × N × L × N float64) stay below this
DEFAULT_LADDER = (0.0, 1e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 1e-3)


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


class OverlapAccumulator:
    """Accumulates one tensor's statistics chunk by chunk; `result()` returns them and resets."""

    def __init__(self, n_agents: int, ladder: tuple[float, ...] = DEFAULT_LADDER) -> None:
        if list(ladder) != sorted(set(ladder)):
            raise ValueError("the ε ladder must be strictly increasing")
        self.n = n_agents
        self.ladder = tuple(float(e) for e in ladder)
        self.joint = joint_fits(n_agents, len(self.ladder))
        self._ladder_t = torch.tensor(self.ladder, dtype=torch.float32)
        if self.joint:
            self._tables = _decode_tables(n_agents, len(self.ladder))
        self._reset()

    def _reset(self, device: torch.device | str = "cpu") -> None:
        n, L = self.n, len(self.ladder)
        self._device = torch.device(device)
        self._finite: torch.Tensor | None = None
        if self.joint:
            states = self._tables["states"]
            self._counts = torch.zeros(states, dtype=torch.float64, device=device)
            self._sq = torch.zeros(n, states, dtype=torch.float64, device=device)
        else:
            z = {"device": device}
            self._acc = TensorStats(*(torch.zeros(n, L, dtype=torch.int64, **z) for _ in range(3)),
                                    torch.zeros(n, L, n, dtype=torch.int64, **z),
                                    torch.zeros(n, L, dtype=torch.float64, **z),
                                    torch.zeros(n, L, dtype=torch.float64, **z),
                                    torch.zeros(n, L, dtype=torch.int64, **z))

    def _on(self, device: torch.device) -> None:
        """Keep the sums on the device the task vectors are on (reset while nothing is summed yet)."""
        if device != self._device:
            if self._finite is not None:
                raise RuntimeError("one tensor's chunks came from two devices")
            self._reset(device)

    def add_chunk(self, chunk, fused: bool) -> bool:
        """Add a chunk given as merging.tensor_merge.ChunkInputs; `fused` uses the numba kernel."""
        if not (fused and self.joint):
            return self.add(chunk.taus)
        from merging.kernels import cpu

        base, agents = chunk.raw()
        if base.size == 0:
            return True
        counts, sq = cpu.overlap_histogram(base, agents, self._ladder_t.numpy(), cpu.hist_parts(base.size))
        self._counts += torch.from_numpy(counts).double()
        sq_t = torch.from_numpy(sq)
        self._sq += sq_t
        return bool(torch.isfinite(sq_t.sum()))

    def add(self, taus: torch.Tensor, deferred: bool = False) -> bool:
        """Add a chunk of task vectors (N, E), float32 on any device; False if it held NaN or Inf.

        NaN and ±Inf sort above every ladder value, so they land in the squared sums and show there.
        The sums stay on the task vectors' device. With `deferred`, nothing waits for that device: the
        finite check is kept there too (see `take`), and True is returned.
        """
        if taus.shape[1] == 0:
            return True
        self._on(taus.device)
        ladder = self._ladder_t.to(taus.device)
        b = torch.searchsorted(ladder, taus.abs().contiguous())  # number of ladder values < |τ|
        sq = self._add_joint(taus, b) if self.joint else self._add_direct(taus, b)
        finite = torch.isfinite(sq)
        self._finite = finite if self._finite is None else self._finite & finite
        return True if deferred else bool(finite)

    def _add_joint(self, taus: torch.Tensor, b: torch.Tensor) -> bool:
        n, s = self.n, 2 * (len(self.ladder) + 1)
        code = torch.zeros(taus.shape[1], dtype=torch.int64, device=taus.device)
        for t in range(n):
            code += (b[t] * 2 + (taus[t] > 0)) * (s ** t)
        states = self._tables["states"]
        self._counts += _bincount(code, states).double()
        sq = torch.stack([_bincount(code, states, taus[t].double().square())
                          for t in range(n)])
        self._sq += sq
        return sq.sum()

    def _add_direct(self, taus: torch.Tensor, b: torch.Tensor) -> bool:
        acc = self._acc
        pos_all, neg_all = taus > 0, taus < 0
        sq = taus.double().square()
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
                acc.hist[t, j] += _bincount(torch.where(m[t], c, 0), self.n + 1)[1:]
        return sq.sum()

    @property
    def pending_nbytes(self) -> int:
        """What one `take`n tensor's sums hold, in bytes (what keeping several for `results` costs)."""
        n, L = self.n, len(self.ladder)
        return (1 + n) * self._tables["states"] * 8 if self.joint else (6 + n) * n * L * 8

    def take(self) -> "Pending":
        """This tensor's sums as they are (on their device; nothing waits for it), and a reset."""
        if self.joint:
            sums: tuple = (self._counts, self._sq)
        else:
            sums = tuple(getattr(self._acc, f) for f in TensorStats.__dataclass_fields__)
        pending = Pending(sums, self._finite)
        self._reset(self._device)
        return pending

    def result(self, pending: "Pending | None" = None) -> TensorStats:
        """The statistics of the tensor summed so far (or of a `take`n one); resets."""
        batch = self.results([pending if pending is not None else self.take()])
        return TensorStats(*(getattr(batch, f)[0] for f in TensorStats.__dataclass_fields__))

    def results(self, pendings: Sequence["Pending"]) -> TensorStats:
        """The statistics of one or more `take`n tensors at once, each array with a leading tensor axis:
        one matrix product per table for the whole batch instead of a dozen small operations per tensor."""
        n, L = self.n, len(self.ladder)
        sums = [tuple(t.cpu() for t in p.sums) for p in pendings]
        if not self.joint:
            return TensorStats(*(torch.stack(f) for f in zip(*sums)))
        tb, T = self._tables, len(sums)
        counts = torch.stack([s[0] for s in sums])  # (T, states)
        sq = torch.stack([s[1] for s in sums])  # (T, N, states)
        used = (counts.sum(0) != 0).nonzero().squeeze(1)  # only the states that occur (few in small tensors)
        counts, sq, states = counts[:, used], sq[:, :, used], len(used)

        def per(ind: torch.Tensor, *shape: int) -> torch.Tensor:  # (states, N, L, …) indicator → counts
            return (counts @ ind[used].reshape(states, -1)).reshape(T, *shape).round().to(torch.int64)

        sq_unique = torch.einsum("uts,stj->utj", sq, tb["unique"][used])
        sq_shared = torch.einsum("uts,stj->utj", sq, tb["shared"][used])
        return TensorStats(per(tb["active"], n, L), per(tb["shared"], n, L), per(tb["unique"], n, L),
                           per(tb["hist"], n, L, n), sq_unique, sq_shared, per(tb["conflict"], n, L))


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

    def all_finite(self) -> bool:
        return self.finite is None or bool(self.finite)


def _bincount(x: torch.Tensor, bins: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """torch.bincount with a known number of bins; on a GPU by scatter-add, which (unlike bincount)
    does not wait for the device to learn the largest value."""
    if x.device.type == "cpu":
        return torch.bincount(x.reshape(-1), weights=weights, minlength=bins)
    src = weights.reshape(-1) if weights is not None else torch.ones_like(x.reshape(-1), dtype=torch.int64)
    return torch.zeros(bins, dtype=src.dtype, device=x.device).scatter_add_(0, x.reshape(-1).long(), src)


def _decode_tables(n: int, L: int) -> dict:
    """Indicator tables over joint states: which agents are active/unique/shared/conflicting at each ε."""
    s = 2 * (L + 1)
    states = s ** n
    code = torch.arange(states, dtype=torch.int64)
    digits = torch.stack([(code // s ** t) % s for t in range(n)], 1)  # (states, N)
    b, pos = digits // 2, (digits % 2).bool()
    active = b.unsqueeze(2) > torch.arange(L).view(1, 1, L)  # (states, N, L): |τ_t| > ε_j
    c, shared, unique = regions.shared_and_unique(active, dim=1)
    c = c.unsqueeze(1)  # (states, 1, L)
    n_pos = (active & pos.unsqueeze(2)).sum(1, keepdim=True)
    n_neg = (active & ~pos.unsqueeze(2)).sum(1, keepdim=True)
    conflict = shared & torch.where(pos.unsqueeze(2), n_neg > 0, n_pos > 0)
    k = torch.arange(1, n + 1).view(1, 1, 1, n)
    hist = active.unsqueeze(3) & (c.unsqueeze(3) == k)  # (states, N, L, N)
    f = torch.float64
    return {"states": states, "active": active.to(f), "shared": shared.to(f), "unique": unique.to(f),
            "conflict": conflict.to(f), "hist": hist.to(f)}

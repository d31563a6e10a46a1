"""Overlap statistics of one tensor for a whole ladder of ε values in a single pass over its chunks.

Each |τ_t| is bucketed once into the ladder (b = number of ladder values below it, so m_t(ε_j) is
b_t > j); with the sign of τ_t, each element's joint state over the N agents has (2·(L+1))^N values.
One histogram of joint states (plus one weighted by τ_t² per agent) then gives, for every ε at once,
changed/shared/unique counts, the overlap histogram, L2 norms of unique and shared parts, and sign
conflicts. For many agents the state space explodes, so N > JOINT_MAX_AGENTS loops over ε instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from merging import regions

JOINT_MAX_AGENTS = 4
DEFAULT_LADDER = (0.0, 1e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 1e-3)


@dataclass
class TensorStats:
    """Per-agent, per-ε statistics of one tensor; arrays are (N, L) unless noted."""

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
        self.joint = n_agents <= JOINT_MAX_AGENTS
        self._ladder_t = torch.tensor(self.ladder, dtype=torch.float32)
        if self.joint:
            self._tables = _decode_tables(n_agents, len(self.ladder))
        self._reset()

    def _reset(self) -> None:
        n, L = self.n, len(self.ladder)
        if self.joint:
            states = self._tables["states"]
            self._counts = torch.zeros(states, dtype=torch.float64)
            self._sq = torch.zeros(n, states, dtype=torch.float64)
            # The kernel's squares, binned by (k_t, max over other agents of k_s): (N, (L+1)²).
            self._sq_km = torch.zeros(n, (L + 1) ** 2, dtype=torch.float64)
        else:
            self._acc = TensorStats(*(torch.zeros(n, L, dtype=torch.int64) for _ in range(3)),
                                    torch.zeros(n, L, n, dtype=torch.int64),
                                    torch.zeros(n, L, dtype=torch.float64), torch.zeros(n, L, dtype=torch.float64),
                                    torch.zeros(n, L, dtype=torch.int64))

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
        self._sq_km += sq_t
        return bool(torch.isfinite(sq_t.sum()))

    def add(self, taus: torch.Tensor) -> bool:
        """Add a chunk of task vectors (N, E), float32 on any device; False if it held NaN or Inf.

        NaN and ±Inf sort above every ladder value, so they land in the squared sums and show there.
        """
        if taus.shape[1] == 0:
            return True
        ladder = self._ladder_t.to(taus.device)
        b = torch.searchsorted(ladder, taus.abs().contiguous())  # number of ladder values < |τ|
        if self.joint:
            return self._add_joint(taus, b)
        return self._add_direct(taus, b)

    def _add_joint(self, taus: torch.Tensor, b: torch.Tensor) -> bool:
        n, s = self.n, 2 * (len(self.ladder) + 1)
        code = torch.zeros(taus.shape[1], dtype=torch.int64, device=taus.device)
        for t in range(n):
            code += (b[t] * 2 + (taus[t] > 0)) * (s ** t)
        states = self._tables["states"]
        self._counts += torch.bincount(code, minlength=states).double().cpu()
        sq = torch.stack([torch.bincount(code, weights=taus[t].double().square(), minlength=states)
                          for t in range(n)]).cpu()
        self._sq += sq
        return bool(torch.isfinite(sq.sum()))

    def _add_direct(self, taus: torch.Tensor, b: torch.Tensor) -> bool:
        acc = self._acc
        pos_all, neg_all = taus > 0, taus < 0
        sq = taus.double().square()
        for j in range(len(self.ladder)):
            m = b > j  # |τ| > ε_j: the rule of Eq. 1 through the ladder buckets
            c, shar, uniq = regions.shared_and_unique(m)
            pos = (m & pos_all).sum(0)
            neg = (m & neg_all).sum(0)
            acc.changed[:, j] += m.sum(1).cpu()
            acc.unique[:, j] += uniq.sum(1).cpu()
            acc.shared[:, j] += shar.sum(1).cpu()
            acc.sq_unique[:, j] += (sq * uniq).sum(1).cpu()
            acc.sq_shared[:, j] += (sq * shar).sum(1).cpu()
            opposite = torch.where(pos_all, neg > 0, pos > 0)
            acc.conflicts[:, j] += (shar & opposite).sum(1).cpu()
            for t in range(self.n):
                acc.hist[t, j] += torch.bincount(c[m[t]], minlength=self.n + 1)[1:].cpu()
        return bool(torch.isfinite(sq.sum()))

    def result(self) -> TensorStats:
        if not self.joint:
            out = self._acc
            self._reset()
            return out
        tb = self._tables
        n, L = self.n, len(self.ladder)
        counts = self._counts

        def per(ind: torch.Tensor) -> torch.Tensor:  # (states, N, L) indicator → (N, L) counts
            return (counts @ ind.reshape(ind.shape[0], -1)).reshape(n, L).round().to(torch.int64)

        def sq_per(ind: torch.Tensor) -> torch.Tensor:
            return torch.einsum("ts,stj->tj", self._sq, ind)

        # t is unique at ε_j iff k_t > j and every other agent's k ≤ j; shared iff some other k > j.
        km = self._sq_km.view(n, L + 1, L + 1)
        k = torch.arange(L + 1).view(L + 1, 1, 1)
        m = torch.arange(L + 1).view(1, L + 1, 1)
        j = torch.arange(L).view(1, 1, L)
        uniq_km = torch.einsum("tkm,kmj->tj", km, ((k > j) & (m <= j)).double())
        shared_km = torch.einsum("tkm,kmj->tj", km, ((k > j) & (m > j)).double())

        hist = (counts @ tb["hist"].reshape(tb["states"], -1)).reshape(n, L, n).round().to(torch.int64)
        out = TensorStats(per(tb["active"]), per(tb["shared"]), per(tb["unique"]), hist,
                          sq_per(tb["unique"]) + uniq_km, sq_per(tb["shared"]) + shared_km, per(tb["conflict"]))
        self._reset()
        return out


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

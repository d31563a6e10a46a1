"""Merging one tensor from a stream of chunks: run the method's passes, then its merge, chunk by chunk.

The streaming engine and the in-memory helper (tests, the app's toy examples) share this, so the same
code decides results whatever the chunk size.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import torch

from .device import to_compute
from .kernels import one_thread_for
from .methods import get_method
from .methods.base import ChunkContext, MergeMethod, agent_seed_keys
from . import regions


class ChunkInputs:
    """One chunk: base (E,) and agents (N × (E,)) as stored (CPU), with float32 forms made on demand.

    `stage`, when given, holds the same values as one (1 + N, E) tensor of one stored dtype, base first
    (the reader's staging buffer): it goes to the device in one copy and is widened there, and the
    fused kernels read it in place. The torch path (GPUs, and methods without kernels) uses
    `base`/`agents`/`taus` on the compute device; with `keep_agents` False τ is computed in place,
    saving one (N, E) buffer. The fused CPU kernels read `raw()` (bf16 bit patterns or float32) and
    widen in cache.
    """

    def __init__(self, base: torch.Tensor, agents: list[torch.Tensor | None], device: torch.device,
                 keep_agents: bool, stage: torch.Tensor | None = None) -> None:
        self._base_raw = base.reshape(-1)
        self._agents_raw = [self._base_raw if a is None else a.reshape(-1) for a in agents]
        self._stage = stage
        self._device = device
        self._keep = keep_agents
        self._models: torch.Tensor | None = None
        self._taus: torch.Tensor | None = None
        self._raw: tuple[Any, Any] | None = None

    @property
    def numel(self) -> int:
        return self._base_raw.numel()

    @property
    def models(self) -> torch.Tensor:
        """Base and agents as one (1 + N, E) float32 tensor on the compute device."""
        if self._models is None:
            if self._stage is not None:
                self._models = to_compute(self._stage, self._device)
            else:
                raws = [self._base_raw, *self._agents_raw]
                out = torch.empty((len(raws), self.numel), dtype=torch.float32, device=self._device)
                for t, a in enumerate(raws):
                    to_compute(a, self._device, out=out[t])
                self._models = out
        return self._models

    @classmethod
    def on_device(cls, models: torch.Tensor, keep_agents: bool) -> "ChunkInputs":
        """Inputs already widened on the device: `models` is (1 + N, E) float32, base first."""
        chunk = cls(models[0], [None] * (models.shape[0] - 1), models.device, keep_agents)
        chunk._models = models
        return chunk

    def set_models(self, models: torch.Tensor) -> None:
        """Use `models` ((1 + N, E) float32 on the device, e.g. uploaded by the engine's lanes)."""
        self._models = models

    @property
    def base(self) -> torch.Tensor:
        return self.models[0]

    @property
    def agents(self) -> torch.Tensor:
        return self.models[1:]

    @property
    def taus(self) -> torch.Tensor:
        if self._taus is None:
            self._taus = self.agents - self.base if self._keep else self.agents.sub_(self.base)
        return self._taus

    def peak_abs_tau(self, fused: bool) -> torch.Tensor:
        """Each agent's max |τ| over the chunk (NaN if any τ is NaN), by the fused kernel or by torch."""
        if fused:
            from .kernels import cpu

            base, agents = self.raw()
            return max_over_parts(cpu.peak_abs_tau(base, agents, cpu.parts(base.size)))
        taus = self.taus
        return taus.abs().amax(1) if taus.numel() else torch.zeros(taus.shape[0], device=taus.device)

    def raw(self) -> tuple[Any, Any]:
        """Numpy views for the kernels: base (E,) and agents (N, E), all bf16 as uint16 bit patterns, or
        all float32 (the staging buffer itself when it holds one of these)."""
        if self._raw is None:
            st = self._stage
            if st is None:
                tensors = [self._base_raw, *self._agents_raw]
                if all(t.dtype == torch.bfloat16 for t in tensors):
                    st = torch.stack(tensors)
                else:
                    st = torch.stack([t.to(torch.float32) for t in tensors])
            if st.dtype == torch.bfloat16:
                arr = st.view(torch.uint16).numpy()
            else:
                arr = st.to(torch.float32).numpy()
            self._raw = (arr[0], arr[1:])
        return self._raw


def max_over_parts(peak: np.ndarray) -> torch.Tensor:
    """Reduce a kernel's per-partition, per-agent max |τ| (parts, N) to (N,), keeping NaNs."""
    return torch.from_numpy(peak.max(axis=0) if peak.size else peak.sum(axis=0))


class TensorMerger:
    """State machine for one tensor: `reduce` chunks for each pass round, then `merge` chunks in order.

    With `fused` set (CPU, numba available) passes and merges use the method's fused kernels where it
    has them, and the torch functions otherwise; both give the same bits.
    """

    def __init__(self, method: MergeMethod, params: dict[str, Any], tensor: str, numel: int,
                 n_agents: int, shared: dict[str, Any], fused: bool = False) -> None:
        self.method = method
        self.passes = method.passes(params)
        self.ctx = ChunkContext(tensor, 0, numel, agent_seed_keys(n_agents), params, {}, shared)
        self.fused = fused
        self._total: torch.Tensor | None = None

    @property
    def rounds(self) -> int:
        """Number of times the tensor's chunks are visited: one per pass, plus the merge."""
        return len(self.passes) + 1

    def reduce(self, round_: int, offset: int, chunk: ChunkInputs) -> None:
        self.ctx.offset = offset
        p = self.passes[round_]
        if self.fused and p.fused_reduce is not None:
            from .kernels.cpu import parts

            with one_thread_for(parts(chunk.numel)):
                part = p.fused_reduce(*chunk.raw(), self.ctx)
        else:
            part = p.reduce(chunk.taus, self.ctx)
        self._total = part if self._total is None else self._total + part

    def finish_round(self, round_: int) -> None:
        self.passes[round_].finish(self._total, self.ctx)
        self._total = None

    def merge(self, offset: int, chunk: ChunkInputs, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """θ0 + τ_m for the chunk (float32, (E,)) and each agent's max |τ| in it (NaN if any τ is NaN).

        The fused kernels write into `out` (float32, (E,)) when it is given."""
        self.ctx.offset = offset
        if self.fused and self.method.fused is not None:
            from .kernels.cpu import parts

            base, agents = chunk.raw()
            out = np.empty(chunk.numel, np.float32) if out is None else out.numpy()
            peak = np.zeros((parts(chunk.numel), len(agents)), np.float32)
            with one_thread_for(peak.shape[0]):
                self.method.fused(base, agents, self.ctx, out, peak)
            return torch.from_numpy(out), max_over_parts(peak)
        peak = chunk.peak_abs_tau(fused=False)  # before merge, which may work on τ in place
        return chunk.base + self.method.merge(chunk.taus, self.ctx), peak


def merge_in_memory(method: str | MergeMethod, taus: torch.Tensor, params: dict[str, Any] | None = None, *,
                    chunk_elems: int | None = None, agents: Iterable[str] | None = None,
                    tensor: str = "tensor", counts: dict[str, list[int]] | None = None,
                    base: torch.Tensor | None = None, fused: bool = False) -> torch.Tensor:
    """Merge task vectors `taus` (N, ...) of one tensor in float32 and return τ_m; for tests and toys.

    With `base` given the result is θ0 + τ_m instead, and `fused` runs the CPU kernels (tests compare).
    """
    m = get_method(method) if isinstance(method, str) else method
    p = m.resolve_params(params or {})
    labels = list(agents) if agents is not None else [f"agent{i}" for i in range(taus.shape[0])]
    flat = taus.to(torch.float32).reshape(taus.shape[0], -1)
    eps = m.global_counts_eps(p)
    if eps is not None and counts is None:
        counts = regions.count_lists(regions.counts(flat, eps))
    shared = m.prepare(p, counts if eps is not None else None, labels)
    tm = TensorMerger(m, p, tensor, flat.shape[1], len(labels), shared, fused=fused)
    zero = base is None
    b = torch.zeros(flat.shape[1]) if zero else base.to(torch.float32).reshape(-1)
    agents_f = flat + b  # θ_t = θ0 + τ_t, so that the chunk inputs look like real models

    def chunk(lo: int, hi: int) -> ChunkInputs:
        c = ChunkInputs(b[lo:hi].contiguous(), list(agents_f[:, lo:hi]), torch.device("cpu"), keep_agents=True)
        if zero:
            c._taus = flat[:, lo:hi]  # exact τ (adding and removing a zero base is exact anyway)
        return c

    step = chunk_elems or max(1, flat.shape[1])
    spans = [(o, min(o + step, flat.shape[1])) for o in range(0, max(1, flat.shape[1]), step)]
    for r in range(len(tm.passes)):
        for lo, hi in spans:
            tm.reduce(r, lo, chunk(lo, hi))
        tm.finish_round(r)
    out = torch.cat([tm.merge(lo, chunk(lo, hi))[0] for lo, hi in spans])
    return out.view(taus.shape[1:])

"""One chunk of base and agents as the engine computes on it: stored values, float32 forms made on demand."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from merging.common.device import to_compute


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
            from merging.kernels import cpu

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

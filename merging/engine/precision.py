"""How much of an agent's update the output's number format cannot hold, measured during the merge.

When an agent stores a tensor in a finer format than the output (fp32 agents, a bf16 output), part of its
update is below the output's resolution: written alone, θ_t rounds to the same output value as θ0. On a fixed
sample (every SAMPLE_STRIDE-th element of every tensor, by flat index) the merge counts, per agent, the elements
it changed (τ ≠ 0) and those whose change vanishes in the output format (out(θ_t) == out(θ0)), and their share
of its update energy Σ τ². A merged element can still move where several agents' updates add up; the note says
what the format takes from each agent's own update.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from merging.common.dtypes import ST_TO_TORCH
from merging.reading.checkpoint import Checkpoint
from merging.reading.chunks import ChunkData

SAMPLE_STRIDE = 64
MANTISSA_BITS = {"F64": 52, "F32": 23, "F16": 10, "BF16": 7, "F8_E4M3": 3, "F8_E5M2": 2}
NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3",
         "F8_E5M2": "float8_e5m2"}


@dataclass
class PrecisionRow:
    """One agent's sampled update in the tensors it stores finer than the output."""

    agent: str
    dtypes: str  # e.g. "F32 → BF16"
    sampled: int = 0
    changed: int = 0
    vanished: int = 0
    sq_changed: float = 0.0
    sq_vanished: float = 0.0

    def text(self) -> str:
        share = 100 * self.vanished / self.changed if self.changed else 0.0
        energy = 100 * self.sq_vanished / self.sq_changed if self.sq_changed else 0.0
        return (f"precision: {self.agent} ({self.dtypes}): {share:.2f} % of its changed elements ({energy:.3g} % of "
                f"its update's Σ τ²) are below the output's resolution — written alone they round back to the base's "
                f"value (sampled: every {SAMPLE_STRIDE}th element, {self.changed:,} changed of {self.sampled:,}).")


class PrecisionProbe:
    """Counts, on the sample, what the output format removes from each agent's update (see the module)."""

    def __init__(self, base: Checkpoint, agents: list[Checkpoint], labels: list[str], out_dtype: str | None) -> None:
        self.base, self.agents, self.out_dtype = base, agents, out_dtype
        self.rows: dict[int, PrecisionRow] = {}
        self.labels = labels

    def coarser(self, agent: int, tensor: str) -> str | None:
        """The output dtype of `tensor` when it is coarser than the agent's stored dtype, else None."""
        entry = self.agents[agent].tensors.get(tensor)
        out = self.out_dtype or self.base.tensors[tensor].dtype
        if entry is None or entry.dtype not in MANTISSA_BITS or out not in MANTISSA_BITS:
            return None
        return out if MANTISSA_BITS[out] < MANTISSA_BITS[entry.dtype] else None

    @property
    def active(self) -> bool:
        """Whether any agent stores any tensor finer than the output (else the probe costs nothing)."""
        return any(self.coarser(k, n) for k in range(len(self.agents)) for n in self.base.tensors)

    def add(self, data: ChunkData) -> None:
        """Count the sample elements of one chunk (its stored values, before any merge work)."""
        span = data.span
        start = (-span.offset) % SAMPLE_STRIDE
        if start >= span.numel:
            return
        b = data.base.reshape(-1)[start::SAMPLE_STRIDE].to(torch.float32)
        for k, a in enumerate(data.agents):
            out = self.coarser(k, span.tensor)
            if a is None or out is None:
                continue
            t = a.reshape(-1)[start::SAMPLE_STRIDE]
            tau = t.to(torch.float64) - b.to(torch.float64)
            changed = tau != 0
            target = ST_TO_TORCH[out]
            vanished = changed & (t.to(target).to(torch.float64) == b.to(target).to(torch.float64))
            row = self.rows.setdefault(k, PrecisionRow(self.labels[k], f"{self.agents[k].tensors[span.tensor].dtype} "
                                                                       f"→ {out}"))
            row.sampled += tau.numel()
            row.changed += int(changed.sum())
            row.vanished += int(vanished.sum())
            sq = tau * tau
            row.sq_changed += float(sq[changed].sum())
            row.sq_vanished += float(sq[vanished].sum())

    def notes(self) -> list[str]:
        """One line per agent that stores tensors finer than the output."""
        return [self.rows[k].text() for k in sorted(self.rows)]

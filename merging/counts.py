"""The counting pass global ρ needs: one streaming read of base + agents → each agent's shared and unique
counts over the whole model at one ε (Eq. 2). Only counts, so it costs about what reading the inputs costs.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from . import regions
from .checkpoint import Checkpoint
from .engine import ProgressFn, check_finite, float_chunks, uses_kernels
from .fingerprint import Fingerprinter
from .stream import DEFAULT_CHUNK_ELEMS


@dataclass
class OverlapCounts:
    """Whole-model shared/unique counts per agent at `eps`, and each agent's max |τ| (0: equals the base)."""

    eps: float
    shared: list[int]
    unique: list[int]
    max_abs_tau: list[float]

    def as_lists(self) -> dict[str, list[int]]:
        return {"shared": list(self.shared), "unique": list(self.unique)}


def count_overlaps(base: Checkpoint, agents: list[Checkpoint], eps: float, *, device: torch.device,
                   chunk_elems: int = DEFAULT_CHUNK_ELEMS, progress: ProgressFn | None = None,
                   cancel: threading.Event | None = None,
                   fingerprinter: Fingerprinter | None = None) -> OverlapCounts:
    """Stream every float tensor once and count, per agent, its shared and unique elements at ε."""
    labels = [a.label for a in agents]
    fused = uses_kernels(device)
    total = torch.zeros(len(agents), 2, dtype=torch.int64)
    peaks = torch.zeros(len(agents), dtype=torch.float64)
    for data, chunk, _last in float_chunks(base, agents, phase="count", device=device, chunk_elems=chunk_elems,
                                           progress=progress, cancel=cancel, fingerprinter=fingerprinter):
        if not chunk.numel:
            continue
        if fused:
            from .kernels import cpu

            base_raw, agents_raw = chunk.raw()
            part = torch.from_numpy(cpu.overlap_counts(base_raw, agents_raw, np.float32(eps), cpu.parts(base_raw.size)))
        else:
            part = regions.counts(chunk.taus, eps).cpu()
        total += part
        peak = check_finite(data, chunk.peak_abs_tau(fused), labels, base.label)
        peaks = torch.maximum(peaks, peak.double().cpu())
    return OverlapCounts(eps, total[:, 0].tolist(), total[:, 1].tolist(), peaks.tolist())

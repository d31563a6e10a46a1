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
from .dtypes import FLOAT_CODES, ITEMSIZE
from .engine import ProgressFn, ProgressTracker, build_inputs, check_finite, tensor_order
from .errors import MergeCancelled
from .fingerprint import Fingerprinter
from .kernels import kernels_enabled
from .stream import DEFAULT_CHUNK_ELEMS, AlignedReader, prefetch, row_spans


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
    names = [n for n in tensor_order(base) if base.tensors[n].dtype in FLOAT_CODES]
    spans = [s for n in names for s in row_spans(n, base.tensors[n].shape, chunk_elems)]
    per_elem = {n: sum(ITEMSIZE[c.tensors[n].dtype] for c in [base, *agents] if n in c.tensors) for n in names}
    tracker = ProgressTracker("count", sum(s.numel * per_elem[s.tensor] for s in spans), len(names), progress)
    fused = device.type == "cpu" and kernels_enabled()
    labels = [a.label for a in agents]
    reader = AlignedReader(base, agents, fingerprinter)
    total = torch.zeros(len(agents), 2, dtype=torch.int64)
    peaks = torch.zeros(len(agents), dtype=torch.float64)
    last_of = {n: row_spans(n, base.tensors[n].shape, chunk_elems)[-1].start for n in names}
    try:
        for data in prefetch(reader.read(s) for s in spans):
            if cancel is not None and cancel.is_set():
                raise MergeCancelled()
            chunk = build_inputs(data, device, fused)
            if chunk.numel:
                if fused:
                    from .kernels import cpu

                    base_raw, agents_raw = chunk.raw()
                    part = torch.from_numpy(cpu.overlap_counts(base_raw, agents_raw, np.float32(eps),
                                                               cpu.parts(base_raw.size)))
                else:
                    part = regions.counts(chunk.taus, eps).cpu()
                total += part
                peak = check_finite(data, chunk.peak_abs_tau(fused), labels, base.label)
                peaks = torch.maximum(peaks, peak.double().cpu())
            span = data.span
            tracker.advance(span.numel * per_elem[span.tensor], span.tensor,
                            tensor_finished=span.start == last_of[span.tensor])
    finally:
        reader.release()
    tracker.advance(0, "", force=True)
    return OverlapCounts(eps, total[:, 0].tolist(), total[:, 1].tolist(), peaks.tolist())

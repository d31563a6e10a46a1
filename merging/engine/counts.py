"""The counting pass global ρ needs: one streaming read of base + agents → each agent's shared and unique
counts over the whole model at one ε (Eq. 2). Only counts, so it costs about what reading the inputs costs.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from merging.kernels import one_thread_for, prepare
from merging.methods import regions
from merging.methods.ram import counts_tied_twice
from merging.methods.steps import Steps, step_thresholds
from merging.passes import (
    GUARD_KERNELS,
    ProgressFn,
    check_finite,
    float_chunks,
    kernel_dtype,
    locate_nonfinite,
    uses_kernels,
)
from merging.reading.checkpoint import Checkpoint
from merging.reading.chunk_inputs import max_over_parts
from merging.reading.chunks import DEFAULT_CHUNK_ELEMS
from merging.reading.fingerprint import Fingerprinter


@dataclass
class OverlapCounts:
    """Whole-model shared/unique counts per agent at `eps`, and each agent's max |τ| (0: equals the base)."""

    eps: regions.Rule
    shared: list[int]
    unique: list[int]
    max_abs_tau: list[float]

    def as_lists(self) -> dict[str, list[int]]:
        return {"shared": list(self.shared), "unique": list(self.unique)}


def count_overlaps(base: Checkpoint, agents: list[Checkpoint], eps: regions.Rule, *, device: torch.device,
                   chunk_elems: int = DEFAULT_CHUNK_ELEMS, progress: ProgressFn | None = None,
                   cancel: threading.Event | None = None, fingerprinter: Fingerprinter | None = None,
                   read_threads: int | None = None, reader=None,
                   weights: Mapping[str, int] | None = None) -> OverlapCounts:
    """Stream every float tensor once and count, per agent, its shared and unique elements at ε (or under the
    step rule, `Steps`: in steps of each base tensor's stored dtype).

    `weights`: how many times to count a tensor (default once); a tied embedding counted twice gives the
    counts of code that counts over a loaded model's `state_dict()` (`stored_tensor_weights`).

    On the CPU one fused kernel gives counts and max |τ| per chunk. On the torch path (a GPU) both are
    summed on the device and read once at the end, so no chunk waits for the device; a NaN or Inf
    found there is then located by a second look at the inputs (error path only). `reader`: inputs held in
    memory (merging.reading.resident), read instead of the files."""
    labels = [a.label for a in agents]
    n = len(agents)
    total = torch.zeros(n, 2, dtype=torch.int64, device=device)
    peaks = torch.zeros(n, dtype=torch.float32, device=device)
    host_total = torch.zeros(n, 2, dtype=torch.int64)
    host_peaks = torch.zeros(n, dtype=torch.float32)
    if uses_kernels(device):  # the merge's kernels: ready by the time the merge starts
        prepare(("ram",) + GUARD_KERNELS, (kernel_dtype([base, *agents]),), wait=False)
    for data, chunk, _last, fused in float_chunks(base, agents, phase="count", device=device,
                                                  chunk_elems=chunk_elems, progress=progress, cancel=cancel,
                                                  fingerprinter=fingerprinter, read_threads=read_threads,
                                                  kernels=("count_and_peak",), reader=reader):
        if not chunk.numel:
            continue
        times = 1 if weights is None else weights.get(data.span.tensor, 1)
        dtype = base.tensors[data.span.tensor].dtype
        if fused:  # counts and max |τ| in one pass over the chunk
            from merging.kernels.common import parts
            from merging.kernels.statistics import count_and_peak

            base_raw, agents_raw = chunk.raw()
            steps = isinstance(eps, Steps)
            thr = step_thresholds([eps.k], dtype)[0] if steps else np.zeros(256, np.float32)
            with one_thread_for(parts(base_raw.size)):
                part, peak_parts = count_and_peak(base_raw, agents_raw, np.float32(0 if steps else eps), thr, steps,
                                                  parts(base_raw.size))
            host_total += torch.from_numpy(part) * times
            peak = check_finite(data, max_over_parts(peak_parts), labels, base.label)
            host_peaks = torch.maximum(host_peaks, peak)
        else:
            total += regions.counts(chunk.taus, eps, chunk.base, dtype) * times
            peaks = torch.maximum(peaks, chunk.peak_abs_tau(False))  # NaN propagates
    total = total.cpu() + host_total
    peaks_host = torch.maximum(peaks.cpu(), host_peaks).double()
    if not bool(torch.isfinite(peaks_host).all()):
        locate_nonfinite(base, agents, device, chunk_elems, read_threads)
    return OverlapCounts(eps, total[:, 0].tolist(), total[:, 1].tolist(), peaks_host.tolist())



def stored_tensor_weights(base: Checkpoint, params: Mapping[str, Any]) -> dict[str, int] | None:
    """The `weights` count_overlaps takes for these parameters: None (every stored tensor once) unless
    `count_tied_twice`, then each tensor as often as the loaded base's `state_dict()` lists it."""
    if not counts_tied_twice(params):
        return None
    from merging.reading.tied import count_multiplicity

    return count_multiplicity(base)

"""The analysis pass: one streaming read of base + agents → per-unit statistics (analysis/units.py).

Small tensors go in batches through one kernel call each (analysis/batched.py); the others stream chunk by chunk
through the joint-state histogram or the per-ε loop (analysis/ladder.py), their sums decoded a batch of tensors
at a time. Every tensor's statistics land in its unit's row (the tensor, or its group for models of very many
tensors); the frames are built once at the end.
"""
from __future__ import annotations

import importlib
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from merging.common.device import gpu_style
from merging.common.dtypes import FLOAT_CODES
from merging.common.errors import MergeCancelled
from merging.common.timeline import mark
from merging.passes import ProgressFn, ProgressTracker, check_finite, float_chunks, locate_nonfinite, uses_kernels
from merging.reading.batches import BatchReader
from merging.reading.checkpoint import Checkpoint, tensor_order
from merging.reading.fingerprint import Fingerprinter, refuse_identical_agents
from merging.reading.structure import structure_of

from .batched import batches_for, run_batches
from .ladder import OverlapAccumulator, Pending, overlap_accumulator
from .units import TensorCounts, UnitSums, batch_from_stats, plan_units

DECODE_BYTES = 32 << 20  # at most this much of per-tensor sums is kept for one batched decoding


@dataclass
class PassOutput:
    """What one pass measured: the two frames, each tensor's counts when rows are groups, the parameter count."""

    frame: object
    pairs: object
    tensor_counts: TensorCounts | None
    total: int
    seconds: float


def run_pass(base: Checkpoint, agents: list[Checkpoint], labels: list[str], ladder: tuple[float, ...],
             device: torch.device, chunk_elems: int, progress: ProgressFn | None, cancel: threading.Event | None,
             steps: bool, grouped: bool) -> PassOutput:
    """Read every float tensor once and return its statistics (see the module docstring)."""
    start = time.perf_counter()
    prints = Fingerprinter([base, *agents])
    names = [n for n in tensor_order(base) if base.tensors[n].dtype in FLOAT_CODES]
    numel = np.array([base.tensors[n].numel for n in names], dtype=np.int64)
    units = plan_units(names, structure_of(base.tensors), numel, grouped)
    sums = UnitSums(units, len(agents), len(ladder))
    position = {n: i for i, n in enumerate(names)}
    total = sum(sum(t[n].nbytes for n in names if n in t) for t in [c.tensors for c in [base, *agents]])
    tracker = ProgressTracker("analyze", total, len(names), progress)  # bytes of input
    batches, rest = batches_for(names, base, agents)
    mark(f"pass planned ({len(names):,} tensors, {sum(map(len, batches)):,} of them in {len(batches)} batches)")
    if batches:
        _import_meanwhile("pandas")
        reader = BatchReader(base, agents, prints)
        try:
            for batch_names, stats, nbytes in run_batches(reader, batches, base, ladder, steps):
                if cancel is not None and cancel.is_set():
                    raise MergeCancelled()
                if not stats.finite.all():
                    locate_nonfinite(base, agents, device, chunk_elems)
                idx = np.array([position[n] for n in batch_names], dtype=np.int64)
                sums.add(idx, stats.with_chance(numel[idx]))
                tracker.advance(nbytes, batch_names[-1], len(batch_names))
        finally:
            reader.close()
        mark("small tensors done (batches)")
    if rest:
        _stream(base, agents, labels, ladder, device, chunk_elems, cancel, steps, prints, rest, tracker, sums,
                lambda idx: numel[idx], position)
        mark("other tensors done (chunks)")
    tracker.advance(0, "", force=True)
    refuse_identical_agents(labels, prints.finish()[1:])
    mark("fingerprints finished")
    frame, pair_frame = sums.frames(labels, ladder)
    mark("frames built")
    return PassOutput(frame, pair_frame, sums.counts, int(numel.sum()), time.perf_counter() - start)


def _stream(base, agents, labels, ladder, device, chunk_elems, cancel, steps, prints, names, tracker, sums,
            numel_of, position) -> None:
    """The tensors too large for a batch (or all of them, without the batch kernel): chunk by chunk."""
    acc = overlap_accumulator(len(agents), ladder, steps=steps)
    deferred = gpu_style(device) and not uses_kernels(device)  # a GPU: nothing waits until the end
    batch = max(1, min(64, DECODE_BYTES // acc.pending_nbytes))  # tensors whose statistics are decoded together
    pending: list[tuple[str, Pending]] = []

    def flush(part: list[tuple[str, Pending]]) -> None:
        idx = np.array([position[n] for n, _ in part], dtype=np.int64)
        sums.add(idx, batch_from_stats(acc.results([p for _, p in part])).with_chance(numel_of(idx)))

    chunks = float_chunks(base, agents, phase="analyze", device=device, chunk_elems=chunk_elems, cancel=cancel,
                          fingerprinter=prints, kernels=("overlap_histogram",), names=names, tracker=tracker)
    for i, (data, chunk, last, fused) in enumerate(chunks):
        if i == 0:
            mark("first chunk read")
            _import_meanwhile("pandas")  # the frame needs it after the pass: 0.3 s, now on a side thread
        dtype = base.tensors[data.span.tensor].dtype
        if deferred:
            acc.add(chunk.taus, chunk.base, dtype, deferred=True)
        elif not _add_chunk(acc, chunk, fused, dtype):
            check_finite(data, chunk.peak_abs_tau(fused), labels, base.label)  # raises, naming where
        if last:
            pending.append((data.span.tensor, acc.take()))
            if not deferred and len(pending) == batch:
                flush(pending)
                pending = []
    if any(not p.all_finite() for _, p in pending):
        locate_nonfinite(base, agents, device, chunk_elems)
    for i in range(0, len(pending), batch):
        flush(pending[i:i + batch])


def _add_chunk(acc: OverlapAccumulator, chunk, fused: bool, dtype: str) -> bool:
    """`acc.add_chunk`, with the kernel kept on this thread when the chunk makes one partition (a small
    tensor: waking the thread pool would cost more than the work)."""
    if not fused:
        return acc.add_chunk(chunk, fused, dtype)
    from merging.kernels import one_thread_for
    from merging.kernels.common import hist_parts

    with one_thread_for(hist_parts(chunk.numel)):
        return acc.add_chunk(chunk, fused, dtype)


_STARTED: set[str] = set()


def _import_meanwhile(module: str) -> None:
    """Import `module` on a side thread, so that its import time overlaps the pass; a later `import` waits
    for it to finish, and imports again (raising there, where it is reported) if it failed here."""
    if module not in sys.modules and module not in _STARTED:
        _STARTED.add(module)
        threading.Thread(target=_import_quietly, args=(module,), name=f"ram-import-{module}", daemon=True).start()


def _import_quietly(module: str) -> None:
    try:
        importlib.import_module(module)
    except BaseException:  # noqa: BLE001 - the caller's own import reports it
        pass

"""The analysis of small tensors in batches: many tensors read at once (merging/reading/batches.py) and their
statistics computed, per tensor and for every ε, in one kernel call (merging/kernels/tensor_stats.py).

The same numbers as the per-tensor path (the joint-state histogram, or the per-ε loop): counts exactly, sums of
squares and products up to the order of float64 additions. Used on the CPU once the kernel is ready; a model
with very many small tensors waits for it (a compile on the first run of a fresh install), since the
per-tensor path would take far longer.
"""
from __future__ import annotations

import numpy as np

from merging.reading.batches import BatchReader, plan_batches

from .ladder import DOMINANCE
from .precision import format_tables
from .units import DOMINATED, TensorBatch

KERNEL = "tensor_stats"
WAIT_ABOVE = 2000  # batchable tensors above which a pass waits for the kernel to compile rather than go without


def kernel_ready(count: int, dtypes: set[str]) -> bool:
    """Whether the batch kernel can run now for these kernel dtypes ("bf16", "f32"): ready, or (for `count`
    tensors above WAIT_ABOVE) worth waiting for."""
    from merging.kernels import kernels_enabled, prepare, ready, settle, wait_ready

    if not kernels_enabled():
        return False
    prepare((KERNEL,), tuple(dtypes), wait=False)
    for d in dtypes:
        settle((KERNEL,), d)
    if all(ready((KERNEL,), d) for d in dtypes):
        return True
    return count > WAIT_ABOVE and wait_ready((KERNEL,), tuple(dtypes))


def batches_for(names: list[str], base, agents) -> tuple[list[list[str]], list[str]]:
    """The batches this pass runs through the kernel, and the tensors left to the per-tensor path."""
    batches, rest = plan_batches(names, base, agents)
    count = sum(len(b) for b in batches)
    dtypes = {"bf16" if base.tensors[b[0]].dtype == "BF16" else "f32" for b in batches}
    if not count or not kernel_ready(count, dtypes):
        return [], list(names)
    return batches, rest


def batch_statistics(stage: np.ndarray, starts: np.ndarray, dtype: str, ladder: tuple[float, ...],
                     steps: bool) -> TensorBatch:
    """The statistics of the tensors of one batch (stage: (1 + N, E) stored values, base first) as TensorBatch."""
    from merging.kernels import one_thread_for
    from merging.kernels.tensor_stats import tensor_stats

    raw = stage if stage.dtype in (np.uint16, np.float32) else stage.astype(np.float32)
    n, T, L = raw.shape[0] - 1, len(starts) - 1, len(ladder)
    P, F = n * (n - 1) // 2, len(DOMINANCE)
    ft = format_tables(dtype, ladder, steps)
    out = {"icnt": np.zeros((T, n, L, 5), np.int64), "hist": np.zeros((T, n, L, n), np.int64),
           "fsum": np.zeros((T, n, L, 6)), "dom": np.zeros((T, n, L, F)), "pint": np.zeros((T, P, L, 2), np.int64),
           "pflt": np.zeros((T, P, L, 3)), "anyc": np.zeros((T, n), np.int64), "below": np.zeros((T, L), np.int64),
           "finite": np.zeros(T, np.bool_)}
    nparts = max(1, min(T, 64, int(starts[-1]) >> 15))
    with one_thread_for(nparts):
        tensor_stats(raw[0], raw[1:], starts, np.asarray(ladder, np.float32), np.array(DOMINANCE), steps, ft.thr,
                     ft.binmap, ft.step32, ft.step64, ft.min_field, nparts, *out.values())
    return _batch(out, n)


def _batch(out: dict[str, np.ndarray], n: int) -> TensorBatch:
    """The kernel's outputs as TensorBatch arrays."""
    icnt, fsum = out["icnt"], out["fsum"]
    agent = {"changed": icnt[..., 0], "shared": icnt[..., 1], "unique": icnt[..., 2], "sq_unique": fsum[..., 0],
             "sq_shared": fsum[..., 1], "sign_conflicts": icnt[..., 3], "dot_others": fsum[..., 2],
             "sq_others": fsum[..., 3]}
    for f, name in enumerate(DOMINATED):
        agent[name] = out["dom"][..., f]
    for k in range(n):
        agent[f"k{k + 1}"] = out["hist"][..., k]
    L = icnt.shape[2]
    agent["changed_any"] = np.repeat(out["anyc"][:, :, None], L, axis=2)
    agent["one_step"] = icnt[..., 4]
    agent["sq_one_step"] = fsum[..., 4]
    agent["chance_unique_binade"] = fsum[..., 5]
    pint, pflt = out["pint"], out["pflt"]
    pair = {"both_changed": pint[..., 0], "same_sign": pint[..., 1], "dot": pflt[..., 0], "sq_a": pflt[..., 1],
            "sq_b": pflt[..., 2]}
    return TensorBatch(agent, pair, out["below"], out["finite"])


def run_batches(reader: BatchReader, batches: list[list[str]], base, ladder: tuple[float, ...], steps: bool):
    """Each batch's names, statistics and bytes read, in turn."""
    for names in batches:
        stage, starts = reader.read(names)
        yield names, batch_statistics(stage, starts, base.tensors[names[0]].dtype, ladder, steps), stage.nbytes

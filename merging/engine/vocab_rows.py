"""The rows of a union vocabulary (merging/reading/vocab.py) that the streaming merge does not compute: each
added token's row, the mean of the rows of the agents that added it, and an agent's padding rows past the
base's. Written after the merge of the base's rows, at their offsets in the planned (widened) tensors."""
from __future__ import annotations

import torch

from merging.common.dtypes import ST_TO_TORCH
from merging.common.errors import RamStudioError
from merging.reading.checkpoint import Checkpoint
from merging.reading.vocab import VocabPlan
from merging.writing.shards import PlannedTensor, ShardSetWriter

BLOCK_ELEMS = 1 << 22  # rows read and written at a time


def widen_plan(plan: list[PlannedTensor], vocab: VocabPlan | None) -> list[PlannedTensor]:
    """The output plan with the vocabulary tensors holding the union's rows."""
    if vocab is None:
        return plan
    return [PlannedTensor(t.name, t.dtype, (vocab.rows, *t.shape[1:])) if t.name in vocab.tensors else t
            for t in plan]


def _runs(sources: dict[int, tuple[int, ...]], split: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """Consecutive rows with the same sources, as (first, stop, sources), never across row `split`."""
    out: list[tuple[int, int, tuple[int, ...]]] = []
    for r, src in sorted(sources.items()):
        if out and out[-1][1] == r and out[-1][2] == src and r != split:
            out[-1] = (out[-1][0], r + 1, src)
        else:
            out.append((r, r + 1, src))
    return out


def mean_rows(agents: list[Checkpoint], tensor: str, first: int, stop: int, sources: tuple[int, ...]) -> torch.Tensor:
    """Rows [first, stop) of `tensor` averaged over the agents in `sources`: their stored values widened to
    float32, summed in agent order, divided by their count (float32)."""
    total: torch.Tensor | None = None
    for k in sources:
        rows = agents[k].read(tensor, first, stop).to(torch.float32)
        if not bool(torch.isfinite(rows).all()):
            raise RamStudioError(f"tensor {tensor!r} of {agents[k].label} holds NaN or Inf in the rows of its "
                                 f"added tokens ({first:,}–{stop - 1:,}).", "Repair or re-download that checkpoint.")
        total = rows if total is None else total + rows
    assert total is not None
    return total if len(sources) == 1 else total / torch.tensor(float(len(sources)), dtype=torch.float32)


def write_vocab_rows(sink: ShardSetWriter, plan: list[PlannedTensor], vocab: VocabPlan | None,
                     agents: list[Checkpoint]) -> int:
    """Write every row of `vocab.sources` into the planned vocabulary tensors (rows inside the base's, already
    written by the merge, are replaced); returns how many rows were written."""
    if vocab is None:
        return 0
    planned = {t.name: t for t in plan}
    written = 0
    for name in vocab.tensors:
        t = planned[name]
        row = 1
        for d in t.shape[1:]:
            row *= d
        per = max(1, BLOCK_ELEMS // max(1, row))
        target = ST_TO_TORCH[t.dtype]
        for first, stop, sources in _runs(vocab.sources, vocab.base_rows):
            holders = tuple(k for k in sources
                            if name in agents[k].tensors and agents[k].tensors[name].shape[0] >= stop)
            if not holders:
                raise RamStudioError(f"no agent holds rows {first:,}–{stop - 1:,} of {name!r}.",
                                     "The agents' vocabulary tensors disagree; check the agents.")
            for a in range(first, stop, per):
                b = min(stop, a + per)
                out = mean_rows(agents, name, a, b, holders).to(target)
                if not bool(torch.isfinite(out.float()).all()):
                    raise RamStudioError(f"the added rows of {name!r} overflow the output dtype {t.dtype}.",
                                         "Choose a wider --out-dtype.")
                data = out.contiguous().reshape(-1).view(torch.uint8).numpy()
                sink.write_at(name, a * row * out.element_size(), data, rewrite=b <= vocab.base_rows)
                written += b - a
        for k in range(len(agents)):
            agents[k].release()
    return written

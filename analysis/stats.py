"""The analysis pass: one streaming read of base + agents → tidy per-agent × tensor × ε statistics."""
from __future__ import annotations

import importlib
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from merging.checkpoint import Checkpoint, open_checkpoint, unique_labels
from merging.compat import ModelHeaders, check_compatibility
from merging.device import gpu_style, pick_device
from merging.dtypes import FLOAT_CODES
from merging.engine import ProgressFn, check_finite, float_chunks, locate_nonfinite, uses_kernels
from merging.errors import RamStudioError
from merging.fingerprint import Fingerprinter, refuse_identical_agents
from merging.recipe import check_agent_count
from merging.stream import DEFAULT_CHUNK_ELEMS

from . import cache
from .ladder import DEFAULT_LADDER, OverlapAccumulator, Pending
from .names import layer_of, module_of

if TYPE_CHECKING:  # pandas is imported where a frame is built: not before the pass starts reading
    import pandas as pd

STAT_COLUMNS = ["changed", "shared", "unique", "norm_unique", "norm_shared", "sign_conflicts"]


@dataclass
class AnalysisResult:
    """Statistics of one base + agents set; `frame` has one row per agent × tensor × ε."""

    base: str
    agents: list[str]
    ladder: tuple[float, ...]
    total_params: int
    frame: pd.DataFrame
    seconds: float
    fingerprint: str = ""
    from_cache: bool = False
    refs: list[str] = field(default_factory=list)

    def counts_at(self, eps: float) -> dict[str, list[int]]:
        """Whole-model shared/unique counts per agent at ε (what global ρ_t needs)."""
        rows = self.frame[self.frame["eps"] == eps]
        if rows.empty:
            raise RamStudioError(f"ε={eps:g} is not in the analysed ladder {list(self.ladder)}.",
                                 "Re-run the analysis with this ε in --eps-ladder.")
        g = rows.groupby("agent", sort=False)[["shared", "unique"]].sum()
        g = g.reindex(self.agents)
        return {"shared": [int(v) for v in g["shared"]], "unique": [int(v) for v in g["unique"]]}

    def to_payload(self) -> dict:
        return {"base": self.base, "agents": self.agents, "ladder": list(self.ladder),
                "total_params": self.total_params, "seconds": self.seconds, "refs": self.refs,
                "frame": _split(self.frame)}

    @classmethod
    def from_payload(cls, p: dict, fingerprint: str) -> "AnalysisResult":
        import pandas as pd

        f = p["frame"]
        frame = pd.DataFrame(f["data"], columns=f["columns"])
        expected = {"agent", "tensor", "eps", *STAT_COLUMNS}
        if not expected <= set(frame.columns) or frame.empty:
            raise ValueError("incomplete cached frame")
        return cls(p["base"], list(p["agents"]), tuple(p["ladder"]), int(p["total_params"]), frame,
                   float(p["seconds"]), fingerprint, True, list(p.get("refs", [])))


def _split(frame: pd.DataFrame) -> dict:
    """`frame.to_dict(orient="split", index=False)`, the same Python values, built column by column (pandas
    boxes every cell on its own: ~0.2 s for a 0.5B model's statistics)."""
    columns = list(frame.columns)
    return {"columns": columns, "data": [list(row) for row in zip(*(frame[c].tolist() for c in columns))]}


def _open_all(base: Checkpoint | str, agents: Sequence[Checkpoint | str]) -> tuple[Checkpoint, list[Checkpoint]]:
    b = base if isinstance(base, Checkpoint) else open_checkpoint(base)
    return b, [a if isinstance(a, Checkpoint) else open_checkpoint(a) for a in agents]


def analyze(base: Checkpoint | str, agents: Sequence[Checkpoint | str], *,
            ladder: Sequence[float] = DEFAULT_LADDER, device: str = "auto",
            chunk_elems: int = DEFAULT_CHUNK_ELEMS, policy: str = "error", use_cache: bool = True,
            progress: ProgressFn | None = None, cancel: threading.Event | None = None) -> AnalysisResult:
    """Compute overlap statistics for every agent × tensor × ε in one streaming pass (cached on disk)."""
    ladder = validate_ladder(ladder)
    check_agent_count(len(agents))  # before anything is opened
    b, ags = _open_all(base, agents)
    if not ags:
        raise RamStudioError("no agents given.", "Give the base and at least one agent.")
    report = check_compatibility(ModelHeaders.from_checkpoint(b), [ModelHeaders.from_checkpoint(a) for a in ags])
    report.enforce(policy)
    labels = unique_labels([a.label for a in ags])
    key = cache.fingerprint(b, ags, ladder, policy)
    if use_cache:
        cache.check_location([b, *ags])
        payload = cache.load(key)
        if payload is not None:
            try:
                result = AnalysisResult.from_payload(payload, key)
                result.agents = labels
                return result
            except (KeyError, ValueError, TypeError):
                pass  # a damaged entry is rebuilt below
    result = _run_pass(b, ags, labels, ladder, pick_device(device), chunk_elems, progress, cancel)
    result.fingerprint = key
    result.refs = [b.ref.raw] + [a.ref.raw for a in ags]
    if use_cache:
        cache.save(key, result.to_payload())
    return result


def validate_ladder(ladder: Sequence[float]) -> tuple[float, ...]:
    """ε values must be finite, ≥ 0 and distinct; they are sorted."""
    try:
        values = sorted({float(e) for e in ladder})
    except (TypeError, ValueError):
        raise RamStudioError(f"cannot read the ε ladder {ladder!r}.", "Give numbers like 0,1e-6,1e-5.") from None
    if not values:
        raise RamStudioError("the ε ladder is empty.", "Give at least one ε, e.g. 1e-5.")
    if any(e < 0 or e != e or e == float("inf") for e in values):
        raise RamStudioError(f"invalid ε in {values}: each ε must be a finite number ≥ 0.", "E.g. 0,1e-6,1e-5.")
    return tuple(values)


def cached_counts(base: str, agents: Sequence[str], eps: float, policy: str = "error") -> dict[str, list[int]] | None:
    """Whole-model shared/unique counts at ε from a cached analysis of these inputs (default ladder), or
    None: lets a merge skip its counting pass when the statistics were already computed."""
    if eps not in DEFAULT_LADDER:
        return None
    try:
        b, ags = _open_all(base, agents)
        payload = cache.load(cache.fingerprint(b, ags, validate_ladder(DEFAULT_LADDER), policy))
        return AnalysisResult.from_payload(payload, "").counts_at(eps) if payload else None
    except (RamStudioError, KeyError, ValueError, TypeError):
        return None


def _run_pass(base: Checkpoint, agents: list[Checkpoint], labels: list[str], ladder: tuple[float, ...],
              device: torch.device, chunk_elems: int, progress: ProgressFn | None,
              cancel: threading.Event | None) -> AnalysisResult:
    prints = Fingerprinter([base, *agents])
    acc = OverlapAccumulator(len(agents), ladder)
    deferred = gpu_style(device) and not uses_kernels(device)  # a GPU: nothing waits until the end
    batch = max(1, min(64, DECODE_BYTES // acc.pending_nbytes))  # tensors whose statistics are decoded together
    columns: list[dict] = []
    pending: list[tuple[str, Pending]] = []
    start = time.perf_counter()
    chunks = float_chunks(base, agents, phase="analyze", device=device, chunk_elems=chunk_elems, progress=progress,
                          cancel=cancel, fingerprinter=prints, kernels=("overlap_histogram",))
    for i, (data, chunk, last, fused) in enumerate(chunks):
        if i == 0:
            _import_meanwhile("pandas")  # the frame needs it after the pass: 0.3 s, now on a side thread
        if deferred:
            acc.add(chunk.taus, deferred=True)
        elif not _add_chunk(acc, chunk, fused):
            check_finite(data, chunk.peak_abs_tau(fused), labels, base.label)  # raises, naming where
        if last:
            pending.append((data.span.tensor, acc.take()))
            if not deferred and len(pending) == batch:
                columns.append(_columns(base, labels, ladder, acc, pending))
                pending = []
    if any(not p.all_finite() for _, p in pending):
        locate_nonfinite(base, agents, device, chunk_elems)
    for i in range(0, len(pending), batch):
        columns.append(_columns(base, labels, ladder, acc, pending[i:i + batch]))
    refuse_identical_agents(labels, prints.finish()[1:])
    frame = _frame(columns)
    total = sum(e.numel for e in base.tensors.values() if e.dtype in FLOAT_CODES)
    result = AnalysisResult(base.label, labels, ladder, total, frame, time.perf_counter() - start)
    _refuse_unchanged(result)
    return result


def _add_chunk(acc: OverlapAccumulator, chunk, fused: bool) -> bool:
    """`acc.add_chunk`, with the kernel kept on this thread when the chunk makes one partition (a small
    tensor: waking the thread pool would cost more than the work)."""
    if not fused:
        return acc.add_chunk(chunk, fused)
    from merging.kernels import cpu, one_thread_for

    with one_thread_for(cpu.hist_parts(chunk.numel)):
        return acc.add_chunk(chunk, fused)


def _frame(parts: list[dict]) -> pd.DataFrame:
    """One frame from the batches' columns (arrays: objects for labels, numbers), in batch order; label
    columns become strings, the layer column integers when every layer number fits int64."""
    import pandas as pd

    if not parts:
        return pd.DataFrame()
    cols = {c: np.concatenate([np.asarray(part[c]) for part in parts]) for c in parts[0]}
    for c, v in cols.items():
        if v.dtype == object:
            cols[c] = list(v) if c == "layer" else v  # pandas infers int64 (or keeps huge ints) from a list
    return pd.DataFrame(cols)


def _import_meanwhile(module: str) -> None:
    """Import `module` on a side thread, so that its import time overlaps the pass; a later `import` waits
    for it to finish, and imports again (raising there, where it is reported) if it failed here."""
    if module not in sys.modules:
        threading.Thread(target=_import_quietly, args=(module,), name=f"ram-import-{module}", daemon=True).start()


def _import_quietly(module: str) -> None:
    try:
        importlib.import_module(module)
    except BaseException:  # noqa: BLE001 - the caller's own import reports it
        pass


DECODE_BYTES = 32 << 20  # at most this much of per-tensor sums is kept for one batched decoding


def _columns(base: Checkpoint, labels: list[str], ladder: tuple[float, ...], acc: OverlapAccumulator,
             batch: list[tuple[str, Pending]]) -> dict[str, list | np.ndarray]:
    """The frame's columns for a batch of tensors: one row per tensor × agent × ε, in that order."""
    st = acc.results([p for _, p in batch])
    n, L = len(labels), len(ladder)
    per_tensor = n * L
    names = [name for name, _ in batch]

    def per_row(values: list) -> np.ndarray:  # one value per tensor, repeated for its rows (no Python lists)
        return np.repeat(np.array(values + [None], dtype=object)[:-1], per_tensor)

    cols: dict[str, list | np.ndarray] = {
        "agent": np.tile(np.array([a for a in labels for _ in ladder] + [None], dtype=object)[:-1], len(names)),
        "tensor": per_row(names),
        "layer": per_row([layer_of(name) for name in names]),  # objects: a layer number of any size
        "module": per_row([module_of(name) for name in names]),
        "numel": np.repeat(np.array([base.tensors[x].numel for x in names], dtype=np.int64), per_tensor),
        "eps": np.tile(np.array(ladder, dtype=np.float64), len(names) * n),
        "changed": st.changed.reshape(-1).numpy(), "shared": st.shared.reshape(-1).numpy(),
        "unique": st.unique.reshape(-1).numpy(),
        "norm_unique": st.sq_unique.reshape(-1).sqrt().numpy(), "norm_shared": st.sq_shared.reshape(-1).sqrt().numpy(),
        "sign_conflicts": st.conflicts.reshape(-1).numpy()}
    hist = st.hist.reshape(-1, n).numpy()
    for k in range(n):
        cols[f"k{k + 1}"] = hist[:, k]
    return cols


def _refuse_unchanged(result: AnalysisResult) -> None:
    """An agent that changed nothing (at the smallest ε) is almost surely a wrong path: say so."""
    eps0 = result.ladder[0]
    changed = result.frame[result.frame["eps"] == eps0].groupby("agent")["changed"].sum()
    idle = [a for a in result.agents if int(changed.get(a, 0)) == 0]
    if idle:
        raise RamStudioError(
            f"agent {', '.join(idle)} is identical to the base (no parameter differs by more than ε={eps0:g}).",
            "Check the paths: an agent must be a fine-tuned model, not a copy of the base.")

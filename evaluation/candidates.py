"""Merge candidates straight into a loaded model: the inputs are opened and checked once, then every candidate's
weights are produced by the normal streaming engine into the model's own tensors — no folder written.

Where the inputs fit (merging/reading/resident.py) they are read once and kept (stored values on the host, float32 on
a GPU), so a candidate costs only its compute; otherwise every candidate streams from the files as a merge
does. Either way the engine, the methods, the kernels and the output checks are those of `ram-studio merge`,
so the weights are bit for bit the ones its folder would hold (tests compare).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from merging.common.device import pick_device
from merging.common.dtypes import ST_TO_TORCH
from merging.common.errors import RamStudioError
from merging.engine.counts import count_overlaps, stored_tensor_weights
from merging.engine.loop import output_plan, stream_merge
from merging.merge import open_inputs, refuse_idle_agents
from merging.methods import get_method
from merging.methods.regions import Rule
from merging.passes import ProgressFn
from merging.reading.checkpoint import Checkpoint
from merging.reading.chunks import DEFAULT_CHUNK_ELEMS
from merging.reading.fingerprint import Fingerprinter, refuse_identical_agents
from merging.reading.resident import ResidentReader, fits_in_memory
from merging.reading.side_tensors import SideTensors, open_side_tensors, refuse_stale_side
from merging.recipe import MergeSpec
from merging.writing.shards import PlannedTensor

MODES = ("auto", "resident", "stream")
CHECK_EPS = 1e-5  # the ε whose counts the opening pass keeps (the paper's; global ρ at it is then free)


class ModuleSink:
    """An engine sink that writes the merged tensors into a torch module's tensors (by their safetensors names)
    instead of files: each tensor's bytes are gathered in its output dtype and copied in once complete, exactly
    as loading the written file would widen them."""

    def __init__(self, module: torch.nn.Module, plan: list[PlannedTensor]) -> None:
        self.targets = module.state_dict(keep_vars=True)
        missing = [t.name for t in plan if t.name not in self.targets]
        if missing:
            raise RamStudioError(f"the loaded model has no tensor {missing[0]!r} (and {len(missing) - 1} more) "
                                 "that the checkpoint holds.",
                                 "The evaluator must load the base with its checkpoint's tensor names.")
        self.plan = {t.name: t for t in plan}
        self._bufs: dict[str, torch.Tensor] = {}
        self._done: dict[str, int] = {}
        self._lock = threading.Lock()

    def write_at(self, name: str, byte_offset: int, data: Any) -> None:
        """Bytes of tensor `name` from `byte_offset` (called by the engine's writer threads)."""
        t = self.plan[name]
        src = torch.from_numpy(data).view(torch.uint8).reshape(-1)
        with self._lock:
            buf = self._bufs.get(name)
            if buf is None:
                buf = self._bufs[name] = torch.empty(t.nbytes, dtype=torch.uint8)
        if byte_offset < 0 or byte_offset + src.numel() > t.nbytes:
            raise RuntimeError(f"bytes {byte_offset}..{byte_offset + src.numel()} are outside tensor {name}")
        buf[byte_offset:byte_offset + src.numel()].copy_(src)
        with self._lock:
            self._done[name] = self._done.get(name, 0) + src.numel()
            complete = self._done[name] == t.nbytes
            if complete:
                del self._bufs[name]
        if complete:
            value = buf.view(ST_TO_TORCH[t.dtype]).view(t.shape) if t.nbytes else torch.empty(t.shape)
            with torch.no_grad():
                self.targets[name].copy_(value)

    def finish(self) -> None:
        """Every planned tensor must have been written in full (else the model holds a mix of merges)."""
        short = [n for n, t in self.plan.items() if t.nbytes and self._done.get(n, 0) != t.nbytes]
        if short:
            raise RuntimeError(f"the merge did not write every tensor (first: {short[0]})")

    def abort(self) -> None:
        self._bufs.clear()


@dataclass
class MergeOutcome:
    """One candidate produced into the model: seconds, whether any weight differs from the base's, λ_t used."""

    seconds: float
    changed: bool
    lambdas: list[float] | None = None


class CandidateInputs:
    """Base and agents for many merges: opened, checked and fingerprinted once; kept resident where they fit.

    The opening pass reads every input once (into memory when resident) and refuses what a merge would
    refuse: NaN/Inf, an agent equal to the base, two byte-identical agents. `fingerprints` are the inputs'
    content fingerprints (a sweep's resume key)."""

    def __init__(self, base: str, agents: list[str], *, on_mismatch: str = "error", device: str = "auto",
                 mode: str = "auto", chunk_elems: int = DEFAULT_CHUNK_ELEMS,
                 cancel: threading.Event | None = None, progress: ProgressFn | None = None) -> None:
        if mode not in MODES:
            raise RamStudioError(f"unknown input mode {mode!r}.", f"Use one of {', '.join(MODES)}.")
        self.spec = MergeSpec(base, list(agents), "average", on_mismatch=on_mismatch, device=device,
                              chunk_elems=chunk_elems)
        ins = open_inputs(self.spec, 1)
        self.base: Checkpoint = ins.base
        self.agents: list[Checkpoint] = ins.agents
        self.labels: list[str] = ins.labels
        self.notes = ins.notes
        self.device = pick_device(device)
        self.chunk_elems = chunk_elems
        self.resident = mode == "resident" or (mode == "auto" and fits_in_memory(self.base, self.agents, self.device))
        prints = Fingerprinter([self.base, *self.agents])
        self.reader = ResidentReader(self.base, self.agents, device=self.device, chunk_elems=chunk_elems,
                                     fingerprinter=prints) if self.resident else None
        checked = count_overlaps(self.base, self.agents, CHECK_EPS, device=self.device, chunk_elems=chunk_elems,
                                 progress=progress, cancel=cancel, reader=self.reader,
                                 fingerprinter=None if self.resident else prints)
        refuse_idle_agents(self.labels, checked.max_abs_tau)
        found = prints.finish()
        refuse_identical_agents(self.labels, found[1:])
        self.fingerprints = [f["weights_xxh3_128"] for f in found]
        self._counts: dict[tuple[float, bool], dict[str, list[int]]] = {(CHECK_EPS, False): checked.as_lists()}
        self._lock = threading.Lock()

    def counts(self, eps: Rule, params: dict[str, Any] | None = None) -> dict[str, list[int]]:
        """Whole-model shared/unique counts at ε (global ρ): from the analysis cache when it has them (as the
        CLI's merge takes them), else one counting pass over the inputs; kept for later candidates. With
        `params` asking for count_tied_twice, tied aliases count too (the analysis cache counts stored tensors
        once, so it is not used then)."""
        weights = stored_tensor_weights(self.base, params or {})
        key = (eps, weights is not None)
        with self._lock:
            hit = self._counts.get(key)
            if hit is None:
                from analysis.stats import cached_result

                cached = cached_result(self.spec.base, self.spec.agents, self.spec.on_mismatch) \
                    if weights is None else None
                hit = cached.counts_at(eps) if cached is not None and cached.covers(eps) else None
                if hit is None:
                    hit = count_overlaps(self.base, self.agents, eps, device=self.device, chunk_elems=self.chunk_elems,
                                         reader=self.reader, weights=weights).as_lists()
                self._counts[key] = hit
            return hit

    def merge_into(self, module: torch.nn.Module, method_name: str, params: dict[str, Any], *,
                   cancel: threading.Event | None = None, progress: ProgressFn | None = None,
                   side: SideTensors | None = None) -> MergeOutcome:
        """Write the merge of (method, params) into `module`'s tensors; the same checks as a merge (a non-finite
        output is refused, naming where), the base's dtype for every stored value. `side`: the per-agent side
        tensors a method that declares them reads (each agent's Fisher), computed from these agents."""
        t0 = time.perf_counter()
        method = get_method(method_name)
        p = method.resolve_params(params)
        if len(self.agents) < method.min_agents:
            raise RamStudioError(f"{method.name} needs at least {method.min_agents} agents.", "Add agents.")
        eps = method.global_counts_eps(p)
        counts = self.counts(eps, p) if eps is not None else None
        shared = method.prepare(p, counts, self.labels)
        opened = None
        if method.side_tensors is not None or side is not None:
            if side is None or method.side_tensors is None:
                raise RamStudioError(f"{method.name} reads {method.side_tensors or 'no'} side tensors; the candidate "
                                     f"was given {side.kind if side else 'none'}.", "Give the side tensors it reads.")
            opened = open_side_tensors(side, method.side_tensors, self.base, self.labels)
            refuse_stale_side(side, self.labels, self.fingerprints[1:])
        sink = ModuleSink(module, output_plan(self.base, None))
        result = stream_merge(self.base, self.agents, method, p, shared, sink, out_dtype=None, device=self.device,
                              chunk_elems=self.chunk_elems, progress=progress, cancel=cancel,
                              reader=self.reader, side=opened)
        sink.finish()
        lam = shared.get("lambda")
        return MergeOutcome(time.perf_counter() - t0, result.changed,
                            None if lam is None else [float(v) for v in lam.tolist()])

    def load_model_into(self, module: torch.nn.Module, index: int) -> None:
        """Write input model `index` (0 = base, then the agents) into `module` as stored: a reference row's
        weights without loading another model."""
        ckpt = [self.base, *self.agents][index]
        targets = module.state_dict(keep_vars=True)
        with torch.no_grad():
            for name in self.base.tensors:
                src = ckpt.read(name) if name in ckpt.tensors else self.base.read(name)
                if tuple(src.shape) != tuple(targets[name].shape):
                    raise RamStudioError(f"{ckpt.label}: tensor {name!r} has shape {tuple(src.shape)}, the model "
                                         f"{tuple(targets[name].shape)}.", "Score this model on its own.")
                targets[name].copy_(src)
        ckpt.release()

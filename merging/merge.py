"""Merge to a Hugging Face folder, safely: shards + index, config, tokenizer, model card, recipe.

The target is checked against the placement rules (merging/writing/placement.py) and locked before any work;
everything is written into a hidden temporary sibling that is renamed into place only when complete,
checked (finite values, a real change, distinct agents, the recorded input fingerprints) and never over
something that appeared meanwhile. On any error, cancel or signal the temporary folder and any parent
folders this merge created are removed. Inputs are only ever opened for reading.
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from merging.common.device import pick_device
from merging.common.errors import RamStudioError
from merging.common.units import format_bytes, parse_size
from merging.engine.counts import count_overlaps, counts_tied_twice, stored_tensor_weights
from merging.engine.loop import output_plan, stream_merge
from merging.engine.vocab_rows import widen_plan, write_vocab_rows
from merging.interop.mergekit import to_mergekit_yaml
from merging.methods import get_method
from merging.methods.base import MergeMethod
from merging.methods.regions import rho
from merging.passes import ProgressFn
from merging.reading.checkpoint import Checkpoint, open_checkpoint
from merging.reading.compat import AgentLoss, ModelHeaders, estimate_bytes
from merging.reading.fingerprint import Fingerprinter
from merging.reading.model_folder import FileIdentity
from merging.reading.prepare import prepare_inputs
from merging.reading.side_tensors import SideTensors, open_side_tensors, refuse_stale_side
from merging.reading.vocab import VocabPlan, with_vocab_size
from merging.recipe import (
    OUT_DTYPES,
    MergeSpec,
    check_agent_count,
    file_identity,
    input_identities,
    recipe_document,
    refuse_changed,
    write_recipe,
)
from merging.writing import commit as commit_io
from merging.writing.model_card import render_card
from merging.writing.placement import FolderTarget, check_output_folder, protected_files, protected_paths
from merging.writing.shards import ShardSetWriter, plan_shards
from merging.writing.side_files import base_float_dtype, copy_side_files, is_side_file, plan_side_files
from merging.writing.written import WrittenFolder, record

if TYPE_CHECKING:
    from merging.engine.loop import EngineResult

DISK_MARGIN = 64 << 20


@dataclass
class MergeResult:
    """What a merge wrote and how long it took."""

    out: Path
    files: list[Path]
    bytes_written: int
    seconds: float
    lambdas: list[dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)
    losses: list[AgentLoss] = field(default_factory=list)
    written: WrittenFolder | None = None  # what was committed, for reading it back safely (merging.writing.written)
    warnings: list[str] = field(default_factory=list)
    overlap: dict[str, Any] | None = None  # the shared-region diagnostics recorded with the merge, if given
    precision: list[str] = field(default_factory=list)  # per agent stored finer than the output: what it loses
    handling: list[str] = field(default_factory=list)  # how tied heads and added tokens were handled
    lineage: list[str] = field(default_factory=list)  # agents that may not descend from the base (each named)


@dataclass(frozen=True)
class MergeOptions:
    """How one merge runs, beside its spec (what `merge_to_folder` takes as keywords).

    `overwrite` replaces a folder this tool wrote; `allow_noop` writes a merge that changes nothing;
    `expected_inputs` (a recipe's recorded inputs) makes the merge refuse inputs whose content changed;
    `counts` (whole-model shared/unique counts at the method's ε, e.g. from a cached analysis) saves the
    counting pass global ρ otherwise needs; `progress` / `count_progress` follow the merge and the counting
    pass; setting `cancel` stops it; `provenance` (e.g. the mergekit config it came from) is recorded in the
    recipe; `overlap` (the shared-region diagnostics of a cached analysis, analysis.agreement.overlap_summary)
    goes into the card and the recipe; `warn` is told at once about anything allowed but worth knowing (an
    output inside the Hugging Face cache); `side` holds the per-agent side tensors a method that declares them
    reads (e.g. each agent's diagonal Fisher, merging.reading.side_tensors), recorded in the recipe."""

    overwrite: bool = False
    allow_noop: bool = False
    expected_inputs: list[dict[str, Any]] | None = None
    counts: dict[str, list[int]] | None = None
    progress: ProgressFn | None = None
    count_progress: ProgressFn | None = None
    cancel: threading.Event | None = None
    provenance: dict[str, Any] | None = None
    overlap: dict[str, Any] | None = None
    warn: Callable[[str], None] | None = None
    side: SideTensors | None = None


@dataclass
class _Inputs:
    """The opened base and agents (headers only, as the merge reads them: merging/reading/prepare.py), their
    labels, what the mismatch policy cost, the union vocabulary's plan and the lineage warnings."""

    base: Checkpoint
    agents: list[Checkpoint]
    labels: list[str]
    headers: ModelHeaders
    losses: list[AgentLoss]
    notes: list[str]
    side_files: list[FileIdentity] = field(default_factory=list)
    vocab: VocabPlan | None = None
    warnings: list[str] = field(default_factory=list)  # lineage: each names its agent
    handling: list[str] = field(default_factory=list)  # how tied heads and added tokens are handled


@dataclass(frozen=True)
class _Run:
    """A merge resolved once, before any work: the spec, its options, method, parameters, device and inputs."""

    spec: MergeSpec
    options: MergeOptions
    method: MergeMethod
    params: dict[str, Any]
    device: torch.device
    ins: _Inputs
    side: list[Checkpoint] | None = None

    @property
    def models(self) -> list[Checkpoint]:
        return [self.ins.base, *self.ins.agents]


def merge_to_folder(spec: MergeSpec, options: MergeOptions | None = None, **keywords: Any) -> MergeResult:
    """Run `spec` end to end and write the merged model folder atomically.

    The options come as a `MergeOptions` or as its fields by keyword (`overwrite=True, cancel=...`)."""
    if options is not None and keywords:
        raise TypeError(f"merge_to_folder takes options or keywords, not both (got {', '.join(sorted(keywords))})")
    t0 = time.perf_counter()
    run = _resolve(spec, options if options is not None else MergeOptions(**keywords))
    inputs = protected_paths([(c.ref.raw, c.folder) for c in run.models])
    inputs += protected_files([(str(f), f) for f in (run.options.side.files if run.side else ())])
    target = check_output_folder(spec.out, inputs, overwrite=run.options.overwrite, side_file_ok=is_side_file)
    for message in [*run.ins.warnings, *target.warnings]:  # said before any pass
        if run.options.warn is not None:
            run.options.warn(message)
    commit_io.create_parents(target)
    try:
        with commit_io.TargetLock(target.path, f"merge {spec.method} of {len(run.ins.agents)} agents"):
            # Checked again under the lock: another writer may have finished in the meantime.
            target.replaces = check_output_folder(spec.out, inputs, overwrite=run.options.overwrite,
                                                  side_file_ok=is_side_file).replaces
            lambdas, notes, written, precision = _merge_into(target, run)
    except BaseException:
        commit_io.discard(None, target)  # the parent folders this merge created (the lock file is gone now)
        raise
    files = [target.path / f.name for f in written.files]
    return MergeResult(target.path, files, written.bytes, time.perf_counter() - t0, lambdas, notes, run.ins.losses,
                       written, list(target.warnings), run.options.overlap, precision, run.ins.handling,
                       run.ins.warnings)


def _resolve(spec: MergeSpec, options: MergeOptions) -> _Run:
    """Check everything that needs no tensor read: method and parameters, dtype, device, shard size, the
    inputs' headers and side files, and (for a recipe) the inputs' sizes and headers."""
    method = get_method(spec.method)
    params = method.resolve_params(spec.params)
    if spec.out_dtype is not None and spec.out_dtype not in OUT_DTYPES:
        raise RamStudioError(f"output dtype {spec.out_dtype!r} is not a float type.",
                             f"Use one of {', '.join(OUT_DTYPES)}.")
    device = pick_device(spec.device)
    parse_size(spec.shard_size)
    ins = open_inputs(spec, method.min_agents)
    if options.expected_inputs is not None:  # sizes and headers can be compared now; contents once they are read
        refuse_changed(options.expected_inputs, [file_identity(c, None) for c in [ins.base, *ins.agents]],
                        content=False)
    return _Run(spec, options, method, params, device, ins, _side_inputs(method, options.side, ins))


def _side_inputs(method: MergeMethod, side: SideTensors | None, ins: _Inputs) -> list[Checkpoint] | None:
    """The side files a method reads (e.g. each agent's Fisher), opened and checked against the base."""
    if method.side_tensors is None:
        if side is not None:
            raise RamStudioError(f"{method.name} reads no {side.kind} side tensors, but the merge was given them.",
                                 f"Drop them, or merge with a method that reads {side.kind}.")
        return None
    if side is None:
        raise RamStudioError(f"{method.name} needs each agent's {method.side_tensors} (one file per agent), and the "
                             "merge was given none.",
                             f"Compute them first: the CLI, the app and the Python API run the {method.side_tensors} "
                             "pass for you (see the method's documentation).")
    return open_side_tensors(side, method.side_tensors, ins.base, ins.labels)


def open_inputs(spec: MergeSpec, min_agents: int) -> _Inputs:
    """Open base and agents (headers only), check the base's side files, and enforce the mismatch policy,
    recording what it costs."""
    if not spec.agents:
        raise RamStudioError("no agents given.", "Give the base and at least two agents.")
    check_agent_count(len(spec.agents))
    if len(spec.agents) < min_agents:
        raise RamStudioError(f"merging needs at least {min_agents} agents, got {len(spec.agents)}.",
                             "Add another agent (a single agent merged with itself is just that agent).")
    base = open_checkpoint(spec.base)
    agents = [open_checkpoint(a) for a in spec.agents]
    prep = prepare_inputs(base, agents, policy=spec.on_mismatch, untie=spec.untie, vocab=spec.vocab)
    report = prep.report
    prep.enforce(spec.on_mismatch)
    losses = [loss for loss in report.losses() if loss.dropped or loss.padded]
    notes = [f"{m.agent}: {m.kind} {m.tensor or ''} ({m.detail}) — handled by policy '{spec.on_mismatch}'"
             for m in report.mismatches]
    notes += [f"mismatch policy '{spec.on_mismatch}': {loss.describe()}" for loss in losses]
    notes += [f"{agent} read in the base's layout: {line}" for agent, line in report.layout_notes()]
    if report.layout_notes():
        notes.append("mergekit reads every model as it is stored: the mergekit config written with this merge finds "
                     "the tensors of an agent stored in another layout only once it is re-saved in the base's layout")
    notes += prep.notes + [w.text for w in prep.lineage]
    return _Inputs(prep.base_view, prep.agent_views, prep.labels, report.base, losses, notes, plan_side_files(base),
                   prep.vocab_plan, [w.text for w in prep.lineage], prep.notes)


def _merge_into(target: FolderTarget, run: _Run
                ) -> tuple[list[dict[str, Any]] | None, list[str], WrittenFolder, list[str]]:
    """The merge proper, with the target locked: counts (if needed), stream, check, write, commit."""
    _check_disk(target, estimate_bytes(run.ins.headers, run.spec.out_dtype))
    prints = Fingerprinter(run.models)
    counts, identities = _global_counts(run, prints)
    shared = run.method.prepare(run.params, counts, run.ins.labels)
    lambdas = _lambda_rows(run.ins.labels, counts, shared)
    notes = _merge_notes(run)
    tmp = None
    try:
        tmp = commit_io.make_temp_folder(target)
        planned = widen_plan(output_plan(run.ins.base, run.spec.out_dtype), run.ins.vocab)
        sink = ShardSetWriter(tmp, plan_shards(planned, parse_size(run.spec.shard_size)), {"format": "pt"})
        engine = stream_merge(run.ins.base, run.ins.agents, run.method, run.params, shared, sink,
                              out_dtype=run.spec.out_dtype, device=run.device, chunk_elems=run.spec.chunk_elems,
                              progress=run.options.progress, cancel=run.options.cancel, fingerprinter=prints,
                              side=run.side)
        write_vocab_rows(sink, planned, run.ins.vocab, run.ins.agents)
        notes += engine.precision
        refuse_idle_agents(run.ins.labels, engine.max_abs_tau)
        if identities is None:
            identities = input_identities(run.models, prints.finish(), run.ins.labels, run.options.expected_inputs)
        if run.options.side is not None:
            refuse_stale_side(run.options.side, run.ins.labels, [i["weights_xxh3_128"] for i in identities[1:]])
        _check_change(engine, run, notes)
        commit_io.recheck_placement(tmp, target)  # before the small files are written by name into it
        _write_folder(tmp, sink, run, identities, lambdas, notes)
        written = record(tmp, target.path, frozenset({commit_io.PARTIAL_MARKER}))
        commit_io.commit(tmp, target)
    except BaseException:
        commit_io.discard(tmp, target)
        raise
    return lambdas, notes, written, engine.precision


def _global_counts(run: _Run, prints: Fingerprinter
                   ) -> tuple[dict[str, list[int]] | None, list[dict[str, Any]] | None]:
    """The whole-model counts the method needs (None when it needs none), from the options or a counting
    pass; a counting pass reads every input, so it also yields their identities, checked before any write."""
    eps = run.method.global_counts_eps(run.params)
    if eps is None:
        return None, None
    if run.options.counts is not None:
        return run.options.counts, None
    oc = count_overlaps(run.ins.base, run.ins.agents, eps, device=run.device, chunk_elems=run.spec.chunk_elems,
                        progress=run.options.count_progress, cancel=run.options.cancel, fingerprinter=prints,
                        weights=stored_tensor_weights(run.ins.base, run.params))
    refuse_idle_agents(run.ins.labels, oc.max_abs_tau)
    identities = input_identities(run.models, prints.finish(), run.ins.labels, run.options.expected_inputs)
    return oc.as_lists(), identities


def _merge_notes(run: _Run) -> list[str]:
    """The notes the card and the recipe carry: mismatch handling, the preset, per-tensor ρ."""
    notes = list(run.ins.notes)
    if run.options.side is not None:
        notes += list(run.options.side.notes)
    preset = (run.options.provenance or {}).get("preset")
    if preset:
        factor = f" with R = {preset['rescale_factor']:g}" if "rescale_factor" in preset else ""
        notes.append(f"Preset {preset['name']}{factor}: {preset['summary']}")
    if run.params.get("rho_scope") == "tensor":
        notes.append("ρ_t and λ_t are computed per tensor (mergekit ramplus_tl style), so they vary by tensor.")
    elif counts_tied_twice(run.params) and run.method.global_counts_eps(run.params) is not None:
        notes.append(_counting_note(run))
    return notes


def _counting_note(run: _Run) -> str:
    """How the whole-model counts behind ρ_t were made with count_tied_twice: as `state_dict()` lists tensors."""
    from merging.reading.tied import tied_aliases

    aliases = tied_aliases(run.ins.base)
    if not aliases:
        return ("Shared and unique counts are over the loaded model's state_dict(), as the authors' script counts; "
                "the base has no tied alias, so that is every stored tensor once.")
    listed = ", ".join(f"{alias} (= {source})" for alias, source in aliases.items())
    return ("Shared and unique counts are over the loaded model's state_dict(), as the authors' script counts: "
            f"the tied alias {listed} is counted too, so the embedding counts twice.")


def _check_change(engine: EngineResult, run: _Run, notes: list[str]) -> None:
    """Refuse a merge that changes nothing, or only by float32 rounding, unless `allow_noop` (then noted)."""
    if not engine.changed:
        if not run.options.allow_noop:
            raise RamStudioError(
                f"this merge changes nothing: every output value equals the base's ({_param_text(run.params)}).",
                "Check the parameters (a drop rate near 1, a huge ε or a tiny density remove every update); "
                "to write it anyway, use the CLI's --allow-noop.")
        notes.append("WARNING: this merge changes nothing; the weights equal the base's (written on request).")
    elif not engine.beyond_rounding:
        if not run.options.allow_noop:
            raise RamStudioError(
                "this merge changes the weights only by float32 rounding (no change exceeds 4 float32 epsilons "
                "of the weights' scale: for example agents whose updates cancel) "
                f"({_param_text(run.params)}).",
                "Check the agents and the parameters; if their updates really are that small, write it "
                "anyway with the CLI's --allow-noop.")
        notes.append("WARNING: this merge changes the weights only by float32 rounding; written on request.")


def _write_folder(tmp: Path, sink: ShardSetWriter, run: _Run, identities: list[dict[str, Any]],
                  lambdas: list[dict[str, Any]] | None, notes: list[str]) -> None:
    """Everything beside the shards: the index, the base's side files, the mergekit config, recipe and card."""
    index = sink.finish()
    if len(sink.names) > 1:
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config = run.ins.base.config  # the view's: tie_word_embeddings false under --untie
    vocab = run.ins.vocab
    if config is not None and vocab is not None:
        config = with_vocab_size(config, vocab.base_rows, vocab.rows)
    copy_side_files(run.ins.base, tmp, run.spec.out_dtype, run.ins.side_files, config=config,
                    replace=vocab.files if vocab is not None else None)
    recorded = spec_with(run.spec, run.params)
    mergekit = to_mergekit_yaml(recorded, {c.ref.raw: str(c.folder) for c in run.models if c.ref.kind == "demo"},
                                run.spec.out_dtype or base_float_dtype(run.ins.base))
    if mergekit[0] is not None:
        (tmp / "mergekit.yaml").write_text(mergekit[0])
    overlap = run.options.overlap
    extra = {"lambdas": lambdas, "notes": notes, **(run.options.provenance or {})}
    if run.options.side is not None:  # where the side tensors came from (a recipe re-runs it from this)
        extra[run.options.side.kind] = run.options.side.record
    if overlap:
        extra["overlap"] = {k: v for k, v in overlap.items() if k != "markdown"}
    recipe_path = write_recipe(tmp, recipe_document(recorded, identities, extra))
    (tmp / "README.md").write_text(render_card(recorded, run.ins.labels, lambdas, recipe_path.read_text(), notes,
                                               mergekit, (overlap or {}).get("markdown"), run.ins.headers.config))


def _check_disk(target: FolderTarget, needed: int) -> None:
    where = target.path.parent
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    if free < needed + DISK_MARGIN:
        raise RamStudioError(f"not enough disk space in {where}: the merge needs about {format_bytes(needed)}, "
                             f"{format_bytes(free)} are free.", "Free some space or choose another output folder.")


def refuse_idle_agents(labels: list[str], peaks: list[float]) -> None:
    """An agent equal to the base (max |τ| = 0) would contribute nothing: refused, naming it."""
    idle = [label for label, peak in zip(labels, peaks) if peak == 0.0]
    if idle:
        raise RamStudioError(f"agent {', '.join(idle)} is identical to the base: it would contribute nothing.",
                             "Check the paths: an agent must be a fine-tuned model, not a copy of the base.")


def _lambda_rows(labels: list[str], counts: dict[str, list[int]] | None, shared: dict[str, Any]):
    if counts is None or "lambda" not in shared:
        return None
    return [{"agent": a, "shared": s, "unique": u, "rho": _finite_or_none(rho(s, u)), "lambda": float(lv)}
            for a, s, u, lv in zip(labels, counts["shared"], counts["unique"], shared["lambda"].tolist())]


def _param_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "no parameters"


def spec_with(spec: MergeSpec, params: dict[str, Any]) -> MergeSpec:
    """The spec as the recipe records it: every parameter filled in, and the output folder by name only
    (a recipe travels with the model; `run` writes into ./NAME unless told otherwise)."""
    return MergeSpec(**{**spec.to_json(), "params": dict(params), "out": Path(spec.out).name})


def _finite_or_none(x: float) -> float | None:
    return x if x == x and x not in (float("inf"), float("-inf")) else None

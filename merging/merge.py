"""Merge to a Hugging Face folder, safely: shards + index, config, tokenizer, model card, recipe.

The target is checked against the placement rules (merging/placement.py) and locked before any work;
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
from typing import Any, Callable

from merging.reading.checkpoint import Checkpoint, open_checkpoint, unique_labels
from merging.reading.compat import AgentLoss, ModelHeaders, check_compatibility, estimate_bytes
from merging.engine.counts import count_overlaps
from merging.common.device import pick_device
from merging.passes import ProgressFn
from merging.engine.loop import output_plan, stream_merge
from merging.common.errors import RamStudioError
from merging.reading.fingerprint import Fingerprinter, refuse_identical_agents
from merging.interop.mergekit import to_mergekit_yaml
from merging.methods import get_method
from merging.writing.model_card import render_card
from merging.writing.placement import (PARTIAL_MARKER, FolderTarget, TargetLock, check_output_folder, commit,
    create_parents, discard, make_temp_folder, protected_paths)
from merging.reading.model_folder import FileIdentity
from merging.recipe import OUT_DTYPES, MergeSpec, check_agent_count, fingerprint_mismatches, recipe_document, write_recipe
from merging.methods.regions import rho
from merging.writing.side_files import base_float_dtype, copy_side_files, is_side_file, plan_side_files
from merging.common.units import format_bytes, parse_size
from merging.writing.shards import ShardSetWriter, plan_shards
from merging.writing.written import WrittenFolder, record

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


@dataclass
class _Inputs:
    base: Checkpoint
    agents: list[Checkpoint]
    labels: list[str]
    headers: ModelHeaders
    losses: list[AgentLoss]
    notes: list[str]
    side_files: list[FileIdentity] = field(default_factory=list)


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
    headers = ModelHeaders.from_checkpoint(base)
    report = check_compatibility(headers, [ModelHeaders.from_checkpoint(a) for a in agents])
    report.enforce(spec.on_mismatch)
    losses = [loss for loss in report.losses() if loss.dropped or loss.padded]
    notes = [f"{m.agent}: {m.kind} {m.tensor or ''} ({m.detail}) — handled by policy '{spec.on_mismatch}'"
             for m in report.mismatches]
    notes += [f"mismatch policy '{spec.on_mismatch}': {loss.describe()}" for loss in losses]
    return _Inputs(base, agents, unique_labels([a.label for a in agents]), headers, losses, notes,
                   plan_side_files(base))


def merge_to_folder(spec: MergeSpec, *, overwrite: bool = False, allow_noop: bool = False,
                    expected_inputs: list[dict[str, Any]] | None = None,
                    counts: dict[str, list[int]] | None = None, progress: ProgressFn | None = None,
                    count_progress: ProgressFn | None = None, cancel: threading.Event | None = None,
                    provenance: dict[str, Any] | None = None, overlap: dict[str, Any] | None = None,
                    warn: Callable[[str], None] | None = None) -> MergeResult:
    """Run `spec` end to end and write the merged model folder atomically.

    `counts` (whole-model shared/unique counts at the method's ε, e.g. from a cached analysis) saves the
    counting pass global ρ otherwise needs; `expected_inputs` (a recipe's recorded inputs) makes the
    merge refuse inputs whose content changed; `allow_noop` writes a merge that changes nothing;
    `provenance` (e.g. the mergekit config it came from) is recorded in the recipe; `overlap` (the shared-region
    diagnostics of a cached analysis, analysis.agreement.overlap_summary) goes into the card and the recipe;
    `warn` is told at once about anything allowed but worth knowing (an output inside the Hugging Face cache)."""
    t0 = time.perf_counter()
    method = get_method(spec.method)
    params = method.resolve_params(spec.params)
    if spec.out_dtype is not None and spec.out_dtype not in OUT_DTYPES:
        raise RamStudioError(f"output dtype {spec.out_dtype!r} is not a float type.", f"Use one of {', '.join(OUT_DTYPES)}.")
    pick_device(spec.device)
    parse_size(spec.shard_size)
    ins = open_inputs(spec, method.min_agents)
    if expected_inputs is not None:  # sizes and headers can be compared now; contents once they are read
        _refuse_changed(expected_inputs, [_file_identity(c, None) for c in [ins.base, *ins.agents]], content=False)
    inputs = protected_paths([(c.ref.raw, c.folder) for c in [ins.base, *ins.agents]])
    target = check_output_folder(spec.out, inputs, overwrite=overwrite, side_file_ok=is_side_file)
    for message in target.warnings:
        if warn is not None:
            warn(message)
    create_parents(target)
    try:
        with TargetLock(target.path, f"merge {spec.method} of {len(ins.agents)} agents"):
            # Checked again under the lock: another writer may have finished in the meantime.
            target.replaces = check_output_folder(spec.out, inputs, overwrite=overwrite,
                                                  side_file_ok=is_side_file).replaces
            lambdas, notes, written = _merge_into(target, spec, params, ins, allow_noop=allow_noop, counts=counts,
                                                  expected_inputs=expected_inputs, progress=progress,
                                                  count_progress=count_progress, cancel=cancel,
                                                  provenance=provenance, overlap=overlap)
    except BaseException:
        discard(None, target)  # the parent folders this merge created (the lock file is gone now)
        raise
    files = [target.path / f.name for f in written.files]
    return MergeResult(target.path, files, written.bytes, time.perf_counter() - t0, lambdas, notes, ins.losses,
                       written, list(target.warnings), overlap)


def _merge_into(target: FolderTarget, spec: MergeSpec, params: dict[str, Any], ins: _Inputs, *, allow_noop: bool,
                counts: dict[str, list[int]] | None, expected_inputs: list[dict[str, Any]] | None,
                progress: ProgressFn | None, count_progress: ProgressFn | None, cancel: threading.Event | None,
                provenance: dict[str, Any] | None, overlap: dict[str, Any] | None = None
                ) -> tuple[list[dict[str, Any]] | None, list[str], WrittenFolder]:
    """The merge proper, with the target locked: counts (if needed), stream, check, write, commit."""
    method = get_method(spec.method)
    device = pick_device(spec.device)
    models = [ins.base, *ins.agents]
    _check_disk(target, estimate_bytes(ins.headers, spec.out_dtype))
    prints = Fingerprinter(models)
    identities: list[dict[str, Any]] | None = None
    eps = method.global_counts_eps(params)
    if eps is not None and counts is None:
        oc = count_overlaps(ins.base, ins.agents, eps, device=device, chunk_elems=spec.chunk_elems,
                            progress=count_progress, cancel=cancel, fingerprinter=prints)
        refuse_idle_agents(ins.labels, oc.max_abs_tau)
        identities = _identities(models, prints.finish(), ins.labels, expected_inputs)  # before any write
        counts = oc.as_lists()
    shared = method.prepare(params, counts if eps is not None else None, ins.labels)
    lambdas = _lambda_rows(ins.labels, counts, shared) if eps is not None else None
    notes = list(ins.notes)
    preset = (provenance or {}).get("preset")
    if preset:
        factor = f" with R = {preset['rescale_factor']:g}" if "rescale_factor" in preset else ""
        notes.append(f"Preset {preset['name']}{factor}: {preset['summary']}")
    if params.get("rho_scope") == "tensor":
        notes.append("ρ_t and λ_t are computed per tensor (mergekit ramplus_tl style), so they vary by tensor.")
    tmp = None
    try:
        tmp = make_temp_folder(target)
        sink = ShardSetWriter(tmp, plan_shards(output_plan(ins.base, spec.out_dtype), parse_size(spec.shard_size)),
                              {"format": "pt"})
        engine = stream_merge(ins.base, ins.agents, method, params, shared, sink, out_dtype=spec.out_dtype,
                              device=device, chunk_elems=spec.chunk_elems, progress=progress, cancel=cancel,
                              fingerprinter=prints)
        refuse_idle_agents(ins.labels, engine.max_abs_tau)
        if identities is None:
            identities = _identities(models, prints.finish(), ins.labels, expected_inputs)
        if not engine.changed:
            if not allow_noop:
                raise RamStudioError(
                    f"this merge changes nothing: every output value equals the base's ({_param_text(params)}).",
                    "Check the parameters (a drop rate near 1, a huge ε or a tiny density remove every update); "
                    "to write it anyway, use the CLI's --allow-noop.")
            notes.append("WARNING: this merge changes nothing; the weights equal the base's (written on request).")
        elif not engine.beyond_rounding:
            if not allow_noop:
                raise RamStudioError(
                    "this merge changes the weights only by float32 rounding (no change exceeds 4 float32 epsilons "
                    "of the weights' scale: for example agents whose updates cancel) "
                    f"({_param_text(params)}).",
                    "Check the agents and the parameters; if their updates really are that small, write it "
                    "anyway with the CLI's --allow-noop.")
            notes.append("WARNING: this merge changes the weights only by float32 rounding; written on request.")
        index = sink.finish()
        if len(sink.names) > 1:
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        copy_side_files(ins.base, tmp, spec.out_dtype, ins.side_files)
        recorded = spec_with(spec, params)
        mergekit = to_mergekit_yaml(recorded, {c.ref.raw: str(c.folder) for c in models if c.ref.kind == "demo"},
                                    spec.out_dtype or base_float_dtype(ins.base))
        if mergekit[0] is not None:
            (tmp / "mergekit.yaml").write_text(mergekit[0])
        extra = {"lambdas": lambdas, "notes": notes, **(provenance or {})}
        if overlap:
            extra["overlap"] = {k: v for k, v in overlap.items() if k != "markdown"}
        recipe_path = write_recipe(tmp, recipe_document(recorded, identities, extra))
        (tmp / "README.md").write_text(render_card(recorded, ins.labels, lambdas, recipe_path.read_text(), notes,
                                                   mergekit, (overlap or {}).get("markdown")))
        written = record(tmp, target.path, frozenset({PARTIAL_MARKER}))
        commit(tmp, target)
    except BaseException:
        discard(tmp, target)
        raise
    return lambdas, notes, written


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


def _identities(models: list[Checkpoint], prints: list[dict[str, Any]], labels: list[str],
                expected: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Each input's identity for the recipe; refuses byte-identical agents and (with `expected`) inputs
    whose content differs from what a recipe recorded."""
    refuse_identical_agents(labels, prints[1:])
    out = []
    for c, label, fp in zip(models, ["base", *labels], prints):
        # A Hub snapshot folder is named by its commit hash: record it, so a recipe pins what was merged.
        out.append({"ref": c.ref.raw, "kind": c.ref.kind, "label": label, "revision": c.ref.revision,
                    "commit": c.folder.name if c.ref.kind == "hub" else None,
                    "weights_xxh3_128": fp["weights_xxh3_128"], **_file_identity(c, fp)})
    if expected is not None:
        _refuse_changed(expected, out, content=True)
    return out


def _file_identity(c: Checkpoint, fp: dict[str, Any] | None) -> dict[str, Any]:
    """Each weight file's name, size, header hash and (once read) content fingerprint."""
    return {"label": c.label, "files": [{"name": h.path.name, "size": h.file_size, "header_sha256": h.header_sha256,
                                         **({"xxh3_128": fp["files"][h.path.name]} if fp else {})}
                                        for h in c.headers]}


def _refuse_changed(expected: list[dict[str, Any]], found: list[dict[str, Any]], content: bool) -> None:
    problems = fingerprint_mismatches(expected, found, content)
    if problems:
        raise RamStudioError(f"the inputs differ from those the recipe recorded: {'; '.join(problems[:3])}"
                             + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "") + ".",
                             "Point the recipe at the original models, or pass --allow-changed-inputs to "
                             "merge the models as they are now.")


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

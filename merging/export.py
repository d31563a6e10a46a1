"""Merge to a Hugging Face folder, atomically: shards + index, config, tokenizer, model card, recipe.

Everything is written into a hidden temporary sibling folder that is renamed into place only when
complete; on any error, cancel or SIGINT/SIGTERM the temporary folder is removed, so no half model is
ever visible under the target name. Inputs are only ever opened for reading.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint import Checkpoint, open_checkpoint
from .compat import ModelHeaders, check_compatibility, estimate_bytes
from .device import pick_device
from .dtypes import CODE_TO_NAME, FLOAT_CODES
from .engine import ProgressFn, output_plan, stream_merge
from .errors import RamStudioError
from .methods import get_method
from .methods.ram import rho
from .model_card import render_card
from .recipe import MergeSpec, write_recipe
from .writer import ShardSetWriter, parse_size, plan_shards

# Files copied from the base folder next to the weights.
COPY_PATTERNS = ("generation_config.json", "tokenizer*", "special_tokens_map.json", "vocab.*", "merges.txt",
                 "*.model", "*.tiktoken", "chat_template*", "*.jinja", "added_tokens.json",
                 "preprocessor_config.json")
PARTIAL_MARK = ".partial-"
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


def prepare_output(out: Path, overwrite: bool, needed: int) -> Path:
    """Check the target (refuse a non-empty one unless overwrite) and the free space; return a temp sibling."""
    out = out.expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise RamStudioError(f"output path {out} is a file.", "Choose a folder path.")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise RamStudioError(f"output folder {out} exists and is not empty.",
                             "Choose another folder or pass --overwrite.")
    parent = out.parent
    if not parent.exists():
        raise RamStudioError(f"the parent folder {parent} of the output does not exist.", "Create it first.")
    _remove_stale_partials(out)
    free = shutil.disk_usage(parent).free
    if free < needed + DISK_MARGIN:
        raise RamStudioError(f"not enough disk space in {parent}: the merge needs about {needed / 1e9:.2f} GB, "
                             f"{free / 1e9:.2f} GB are free.", "Free some space or choose another output folder.")
    tmp = parent / f".{out.name}{PARTIAL_MARK}{uuid.uuid4().hex[:8]}-{os.getpid()}"
    tmp.mkdir()
    return tmp


def _remove_stale_partials(out: Path) -> None:
    """Remove temporary folders left by killed merges into the same target (their process is gone)."""
    for p in out.parent.glob(f".{out.name}{PARTIAL_MARK}*"):
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def commit_output(tmp: Path, out: Path) -> None:
    """Move the finished temp folder into place (replacing an old folder only now, when overwriting)."""
    out = out.expanduser().absolute()
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def copy_side_files(base: Checkpoint, folder: Path, out_dtype: str | None) -> None:
    """config.json (dtype set to the output's), generation config, tokenizer and chat templates from the base."""
    cfg = dict(base.config or {})
    if cfg:
        dtype = CODE_TO_NAME.get(out_dtype or _float_dtype(base) or "", None)
        if dtype:
            cfg["torch_dtype"] = dtype
            if "dtype" in cfg:
                cfg["dtype"] = dtype
        (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for pattern in COPY_PATTERNS:
        for src in sorted(base.folder.glob(pattern)):
            if src.is_file() and src.name not in ("config.json",) and not src.name.endswith(".safetensors"):
                shutil.copyfile(src, folder / src.name)


def _float_dtype(base: Checkpoint) -> str | None:
    codes = {e.dtype for e in base.tensors.values() if e.dtype in FLOAT_CODES}
    return max(codes, key=lambda c: sum(e.numel for e in base.tensors.values() if e.dtype == c)) if codes else None


def input_fingerprints(models: list[Checkpoint]) -> list[dict[str, Any]]:
    out = []
    for c in models:
        # A Hub snapshot folder is named by its commit hash: record it, so a recipe pins what was merged.
        resolved = c.folder.name if c.ref.kind == "hub" else None
        out.append({"ref": c.ref.raw, "label": c.label, "revision": c.ref.revision, "commit": resolved,
                    "files": [{"name": h.path.name, "size": h.file_size, "header_sha256": h.header_sha256}
                              for h in c.headers]})
    return out


def merge_to_folder(spec: MergeSpec, *, overwrite: bool = False, progress: ProgressFn | None = None,
                    cancel: threading.Event | None = None, analysis_progress: ProgressFn | None = None) -> MergeResult:
    """Run `spec` end to end and write the merged model folder atomically."""
    t0 = time.perf_counter()
    method = get_method(spec.method)
    params = method.resolve_params(spec.params)
    if not spec.agents:
        raise RamStudioError("no agents given.", "Give the base and at least two agents.")
    if len(spec.agents) < method.min_agents:
        raise RamStudioError(f"merging needs at least {method.min_agents} agents, got {len(spec.agents)}.",
                             "Add another agent (a single agent merged with itself is just that agent).")
    if not spec.out:
        raise RamStudioError("no output folder given.", "Pass --out DIR.")
    device = pick_device(spec.device)
    shard_bytes = parse_size(spec.shard_size)
    base = open_checkpoint(spec.base)
    agents = [open_checkpoint(a) for a in spec.agents]
    from analysis.stats import unique_labels  # the analysis package depends on us, not the other way round

    labels = unique_labels([a.label for a in agents])
    base_headers = ModelHeaders.from_checkpoint(base)
    report = check_compatibility(base_headers, [ModelHeaders.from_checkpoint(a) for a in agents])
    report.enforce(spec.on_mismatch)
    notes = [f"{m.agent}: {m.kind} {m.tensor or ''} ({m.detail}) — handled by policy '{spec.on_mismatch}'"
             for m in report.mismatches]

    counts = None
    lambdas = None
    eps = method.global_counts_eps(params)
    if eps is not None:
        from analysis.overlap import DEFAULT_LADDER
        from analysis.stats import analyze

        ladder = sorted(set(DEFAULT_LADDER) | {eps})
        result = analyze(base, agents, ladder=ladder, device=spec.device, chunk_elems=spec.chunk_elems,
                         policy=spec.on_mismatch, progress=analysis_progress, cancel=cancel)
        counts = result.counts_at(eps)
    shared = method.prepare(params, counts, labels)
    if "lambda" in shared and counts is not None:
        lambdas = [{"agent": a, "shared": s, "unique": u, "rho": _finite_or_none(rho(s, u)), "lambda": float(lv)}
                   for a, s, u, lv in zip(labels, counts["shared"], counts["unique"], shared["lambda"].tolist())]
    if params.get("rho_scope") == "tensor":
        notes.append("ρ_t and λ_t are computed per tensor (mergekit ramplus_tl style), so they vary by tensor.")

    out = Path(spec.out)
    plan = output_plan(base, spec.out_dtype)
    tmp = prepare_output(out, overwrite, estimate_bytes(base_headers, spec.out_dtype))
    try:
        sink = ShardSetWriter(tmp, plan_shards(plan, shard_bytes), {"format": "pt"})
        engine = stream_merge(base, agents, method, params, shared, sink, out_dtype=spec.out_dtype, device=device,
                              chunk_elems=spec.chunk_elems, agent_keys=tuple(a.ref.raw for a in agents),
                              progress=progress, cancel=cancel)
        idle = [label for label, peak in zip(labels, engine.max_abs_tau) if peak == 0.0]
        if idle:
            raise RamStudioError(f"agent {', '.join(idle)} is identical to the base: it would contribute nothing.",
                                 "Check the paths: an agent must be a fine-tuned model, not a copy of the base.")
        index = sink.finish()
        if len(sink.names) > 1:
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        copy_side_files(base, tmp, spec.out_dtype)
        recipe_path = write_recipe(tmp, spec_with(spec, params), input_fingerprints([base, *agents]),
                                   {"lambdas": lambdas, "notes": notes})
        card = render_card(spec_with(spec, params), labels, lambdas, recipe_path.read_text(), notes)
        (tmp / "README.md").write_text(card)
        commit_output(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final = Path(spec.out).expanduser().absolute()
    files = sorted(p for p in final.iterdir() if p.is_file())
    return MergeResult(final, files, sum(p.stat().st_size for p in files), time.perf_counter() - t0, lambdas, notes)


def spec_with(spec: MergeSpec, params: dict[str, Any]) -> MergeSpec:
    """The spec with every parameter filled in (defaults included), as the recipe records it."""
    return MergeSpec(**{**spec.to_json(), "params": dict(params)})


def _finite_or_none(x: float) -> float | None:
    return x if x == x and x not in (float("inf"), float("-inf")) else None

"""Command line: `ram-studio inspect | analyze | merge | run | evaluate | sweep | methods`.

Method flags (--eps, --r, --lambda, …) are generated from the methods' parameter declarations. Heavy
modules are imported inside the commands, so `--help` and argument errors answer at once.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator, NoReturn, Sequence

from merging.common.errors import Cancelled, MergeCancelled, RamStudioError, printable

PROG = "ram-studio"


QUIET_HELP = "no progress lines on stderr (results, warnings and errors are still printed)"

def say(text: object = "", file=None) -> None:
    """Print `text` (one or more lines) with every control character escaped in each line: no name, path or
    value read from a file or typed on the command line reaches the terminal raw."""
    print("\n".join(printable(line) for line in str(text).split("\n")), file=file)


def _progress_printer(label: str):
    """A compact progress line on stderr: percent, bytes, tensors, ETA."""
    from merging.common.units import format_bytes, format_seconds

    tty = sys.stderr.isatty()

    def show(p) -> None:
        eta = f", ETA {format_seconds(p.eta)}" if p.eta is not None else ""
        line = (f"{label}: {100 * p.fraction:5.1f}%  {format_bytes(p.done)} of {format_bytes(p.total)}  "
                f"tensors {p.tensors_done}/{p.tensors_total}{eta}")
        if tty:
            sys.stderr.write("\r\033[K" + line)
            if p.done >= p.total:
                sys.stderr.write("\n")
        elif p.done >= p.total:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    return show


def _download_printer():
    """Download progress on stderr: overall percent, bytes, rate and ETA, and the current file. On a terminal
    one line is rewritten in place; otherwise a line is printed per finished file and every 5 seconds."""
    import time

    from merging.common.units import format_bytes, format_seconds

    tty = sys.stderr.isatty()
    state = {"file": None, "files_done": -1, "printed": 0.0}

    def show(p) -> None:
        eta = f"  ETA {format_seconds(p.eta)}" if p.eta is not None and p.done < p.total else ""
        file_pct = f"{100 * p.file_done / p.file_total:.0f}%" if p.file_total else "–"
        line = (f"download: {100 * p.fraction:5.1f}%  {format_bytes(p.done)} of {format_bytes(p.total)}  "
                f"{format_bytes(p.rate)}/s{eta}  [{p.files_done}/{p.files_total} files] "
                f"{printable(p.repo_id)} {printable(p.file)} {file_pct}")
        now = time.monotonic()
        if tty:
            sys.stderr.write("\r\033[K" + line)
            if p.done >= p.total:
                sys.stderr.write("\n")
        elif p.files_done != state["files_done"] or now - state["printed"] >= 5 or p.done >= p.total:
            sys.stderr.write(line + "\n")
            state["printed"] = now
        state["files_done"] = p.files_done
        sys.stderr.flush()

    return show


def _describe_plan(plan) -> list[str]:
    """What a download needs, in lines: per repo its files and size, then the total, where and the free space."""
    from merging.common.units import format_bytes

    lines = [f"{printable(r.repo_id)} @ {r.commit[:12]}: {len(r.files)} files, "
             f"{format_bytes(sum(f.size for f in r.files))}" for r in plan.repos]
    if plan.remaining == 0:
        lines.append(f"everything is already in the cache ({plan.cache_dir}).")
    else:
        kept = plan.cached + plan.partial
        lines.append(f"to download: {format_bytes(plan.remaining)}"
                     + (f" ({format_bytes(kept)} already in the cache, partial files resume)" if kept else "")
                     + f" into {plan.cache_dir} (the Hugging Face cache; {format_bytes(plan.free())} free)")
    return lines


def _prefetch(refs, quiet: bool, stop=None) -> None:
    """Download the Hub models among `refs` that are not in the cache yet, with progress, before a command
    reads them (the command itself then opens them from the cache)."""
    from merging.reading.refs import hub_repos

    hub = hub_repos(list(refs))
    if not hub:
        return
    from merging.reading.hub import download, offline_mode, plan_download

    if offline_mode():
        return  # the command says what is missing from the cache
    plan = plan_download(hub)
    if plan.remaining == 0:
        return
    if not quiet:
        for line in _describe_plan(plan):
            say(f"download: {line}", file=sys.stderr)
    download(plan, progress=None if quiet else _download_printer(), cancel=stop)


def cmd_download(args: argparse.Namespace) -> int:
    from merging.reading.hub import download, plan_download
    from merging.reading.refs import hub_repos

    plan = plan_download(hub_repos(list(args.models)))
    if not plan.repos:
        raise RamStudioError("no Hugging Face repo ids given.", "Give ids like org/name or org/name@revision.")
    for line in _describe_plan(plan):
        say(line)
    if plan.remaining == 0:
        return 0
    with _stop_on_signal() as stop:
        folders = download(plan, progress=None if args.quiet else _download_printer(), cancel=stop)
    for repo_id, folder in folders.items():
        say(f"{printable(repo_id)}: {folder}")
    return 0


def _ladder(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RamStudioError(f"cannot read --eps-ladder {text!r}.", "Use comma-separated numbers, e.g. 0,1e-6,1e-5.")


def _table(frame) -> str:
    """A data frame as text, with every control character in it escaped."""
    return frame.map(lambda v: printable(v, 120) if isinstance(v, str) else v).to_string(index=False)


def _file_output(path: str | None, checkpoints, overwrite: bool) -> Path | None:
    """Check a --json/--csv path against the placement rules before any work starts."""
    if not path:
        return None
    from merging.writing.placement import check_output_file, protected_paths

    return check_output_file(path, protected_paths([(c.ref.raw, c.folder) for c in checkpoints]), overwrite=overwrite)


def cmd_inspect(args: argparse.Namespace) -> int:
    from merging.reading.checkpoint import open_checkpoint
    from merging.reading.compat import ModelHeaders, check_compatibility
    from merging.writing.placement import write_file_atomically

    with _stop_on_signal() as stop:
        _prefetch([args.base, *args.agents], False, stop)
    base = open_checkpoint(args.base)
    agents = [open_checkpoint(a) for a in args.agents]
    out = _file_output(args.json, [base, *agents], args.overwrite)
    report = check_compatibility(ModelHeaders.from_checkpoint(base), [ModelHeaders.from_checkpoint(a) for a in agents])
    if out:
        doc = {"models": report.models_frame().to_dict(orient="records"),
               "mismatches": report.mismatches_frame().to_dict(orient="records"),
               "losses": [loss.__dict__ for loss in report.losses()]}
        write_file_atomically(out, (json.dumps(doc, indent=2, default=str) + "\n").encode())
    frame = report.models_frame()
    frame["GB"] = (frame.pop("bytes_on_disk") / 1e9).round(3)
    say(_table(frame))
    if report.ok:
        say("\ncompatible: same architecture, tensor names, shapes and dtypes.")
        return 0
    say(f"\n{len(report.mismatches)} difference(s) from the base:")
    say(_table(report.mismatches_frame()))
    if args.on_mismatch == "base":
        for loss in report.losses():
            if loss.dropped or loss.padded:
                say(f"  policy 'base': {printable(loss.describe())}")
    report.enforce(args.on_mismatch)
    say(f"\nall differences are handled by --on-mismatch {args.on_mismatch}.")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from analysis.ladder import DEFAULT_LADDER
    from analysis.stats import analyze, size_note
    from merging.reading.checkpoint import open_checkpoint
    from merging.common.escaping import csv_bytes
    from merging.writing.placement import write_file_atomically

    with _stop_on_signal() as stop:
        _prefetch([args.base, *args.agents], args.quiet, stop)
    base = open_checkpoint(args.base)
    agents = [open_checkpoint(a) for a in args.agents]
    json_out = _file_output(args.json, [base, *agents], args.overwrite)
    csv_out = _file_output(args.csv, [base, *agents], args.overwrite)
    pairs_csv_out = _file_output(args.pairs_csv, [base, *agents], args.overwrite)
    ladder = _ladder(args.eps_ladder) if args.eps_ladder else list(DEFAULT_LADDER)
    note = size_note(base, len(agents), ladder)
    if note and not args.quiet:
        say(f"note: {note}", file=sys.stderr)
    with _stop_on_signal() as stop:
        result = analyze(base, agents, ladder=ladder, device=args.device, policy=args.on_mismatch,
                         use_cache=not args.no_cache, progress=None if args.quiet else _progress_printer("analyze"),
                         cancel=stop)
    from analysis import agreement  # pandas: only once there are results
    from analysis.tables import agents_json, global_density, rho_table

    eps = args.eps if args.eps in result.ladder else (1e-5 if 1e-5 in result.ladder else result.ladder[-1])
    table = global_density(result, eps).merge(rho_table(result, eps)[["agent", "rho"]], on="agent")
    table["density"] = (100 * table["density"]).map("{:.3f} %".format)
    say(f"ε = {eps:g}; {result.total_params:,} parameters; "
          f"{'from cache' if result.from_cache else f'{result.seconds:.1f} s'}")
    say(_table(table[["agent", "changed", "shared", "unique", "density", "rho"]]))
    read = agreement.reading(result, eps)
    if len(result.agents) > 1:
        say("\nIs the overlap real? (elements both changed; chance: 50 % same sign, cosine 0)")
        say(_table(_pair_summary(agreement.pair_agreement(result, eps))))
        say(_table(_agent_summary(agreement.agent_agreement(result, eps))))
    say("\n" + textwrap.fill(printable(read.text, 4000), 100))
    if json_out:
        fields = agreement.agent_fields(result)
        records = [{**rec, **fields[(rec["name"], rec["eps"])]} for rec in agents_json(result)]
        doc = {"eps": list(result.ladder), "total_params": result.total_params, "base": result.base,
               "agents": records, "pairs": agreement.pairs_json(result),
               "reading": {"eps": eps, "regime": read.regime, "text": read.text},
               "fingerprint": result.fingerprint, "seconds": result.seconds}
        write_file_atomically(json_out, (json.dumps(doc, indent=2) + "\n").encode())
    if csv_out:
        write_file_atomically(csv_out, csv_bytes(result.frame))
    if pairs_csv_out:
        write_file_atomically(pairs_csv_out, csv_bytes(result.pairs))
    return 0


def _pct(v: float) -> str:
    return "–" if v != v else f"{100 * v:.1f} %"


def _pair_summary(pa):
    """The pair diagnostics as printed columns."""
    import pandas as pd

    return pd.DataFrame({
        "pair": [f"{a}–{b}" for a, b in zip(pa["a"], pa["b"])],
        "both changed": [f"{int(v):,}" for v in pa["both_changed"]],
        "chance (per tensor)": [f"{v:,.0f}" for v in pa["expected_both_tensor"]],
        "same sign": [_pct(v) for v in pa["sign_agreement"]],
        "cosine": ["–" if v != v else f"{v:+.3f}" for v in pa["cosine"]]})


def _agent_summary(ag):
    """The per-agent diagnostics as printed columns."""
    import pandas as pd

    return pd.DataFrame({
        "agent": ag["agent"], "same sign": [_pct(v) for v in ag["sign_agreement"]],
        "all agree (chance)": [f"{_pct(a)} ({_pct(c)})" for a, c in zip(ag["all_agree"], ag["chance_all_agree"])],
        "cosine vs others": ["–" if v != v else f"{v:+.3f}" for v in ag["cosine_others"]],
        "shared energy": [_pct(v) for v in ag["shared_energy_share"]],
        "partners < 10 % / 30 %": [f"{_pct(a)} / {_pct(b)}" for a, b in
                                   zip(ag["dominated_10_share"], ag["dominated_30_share"])],
        "unique (chance: model / tensor)": [f"{_pct(u)} ({_pct(c)} / {_pct(t)})" for u, c, t in
                                            zip(ag["unique_share"], ag["chance_unique_share"],
                                                ag["chance_unique_share_tensor"])]})


def method_flags(sp: argparse.ArgumentParser) -> None:
    """One flag per method parameter name, generated from the declarations (merging/methods)."""
    from merging.methods import all_params, methods_taking

    group = sp.add_argument_group("method parameters (defaults depend on the method; see `methods`)")
    for p in all_params().values():
        users = ", ".join(methods_taking(p.name))
        text = f"{p.help} [{p.range_text()}; default {p.default}; used by {users}]"
        if p.kind is bool:
            group.add_argument(p.flag, dest=p.dest, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            group.add_argument(p.flag, dest=p.dest, default=None, metavar=p.name.upper(),
                               choices=p.choices, help=text)


def params_from_args(args: argparse.Namespace) -> dict:
    """The method parameters given on the command line (as text; the method validates and converts)."""
    from merging.methods import all_params

    return {p.name: getattr(args, p.dest) for p in all_params().values() if getattr(args, p.dest, None) is not None}


def param_flags(params: dict) -> list[str]:
    """The command-line words for method parameters (the inverse of params_from_args): `--name value`, a bool
    as the bare `--name` or `--no-name`; flags come from the declarations (Param.flag)."""
    from merging.methods import all_params

    declared = all_params()
    words: list[str] = []
    for name, value in params.items():
        flag = declared[name].flag
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag[2:])
        else:
            words += [flag, str(value)]
    return words


def _method_and_params(args: argparse.Namespace) -> tuple[str, dict]:
    """--method and the method flags, or a --preset (with --rescale-factor) and the flags it leaves open."""
    given = params_from_args(args)
    if args.preset:
        from merging.methods.presets import apply_preset

        return apply_preset(args.preset, args.method, given, args.rescale_factor)
    if args.rescale_factor is not None:
        raise RamStudioError("--rescale-factor goes with --preset authors-default or authors-soft.",
                             "E.g. --preset authors-default --rescale-factor 1.2, or set --r yourself.")
    if not args.method:
        raise RamStudioError("no merge method given.", "Pass --method NAME (see `methods`) or --preset NAME.")
    return args.method, given


def _spec_from_args(args: argparse.Namespace):
    from merging.common.dtypes import parse_out_dtype
    from merging.recipe import MergeSpec

    method, params = _method_and_params(args)
    return MergeSpec(base=args.base, agents=list(args.agents), method=method, params=params,
                     out=args.out, out_dtype=parse_out_dtype(args.out_dtype) if args.out_dtype else None,
                     shard_size=args.shard_size, device=args.device, on_mismatch=args.on_mismatch,
                     chunk_elems=args.chunk_elems)


def _cached_statistics(spec) -> tuple[dict | None, dict | None]:
    """Counts for global ρ and the diagnostics for the card, from a cached analysis of the same inputs."""
    from analysis.stats import cached_result

    result = cached_result(spec.base, spec.agents, spec.on_mismatch)
    if result is None:
        return None, None
    from analysis.agreement import merge_statistics

    return merge_statistics(result, spec.method, spec.params)


def _run_spec(spec, args: argparse.Namespace, expected_inputs=None, provenance=None) -> int:
    from merging.merge import merge_to_folder
    from merging.common.units import format_bytes

    with _stop_on_signal() as stop:
        _prefetch([spec.base, *spec.agents], args.quiet, stop)
        counts, overlap = _cached_statistics(spec)
        result = merge_to_folder(spec, overwrite=args.overwrite, allow_noop=args.allow_noop,
                                 expected_inputs=expected_inputs, counts=counts, provenance=provenance, overlap=overlap,
                                 warn=lambda message: say(f"warning: {message}", file=sys.stderr),
                                 progress=None if args.quiet else _progress_printer("merge"),
                                 count_progress=None if args.quiet else _progress_printer("count"), cancel=stop)
    say(f"wrote {result.out} ({format_bytes(result.bytes_written)} in {len(result.files)} files, "
          f"{result.seconds:.1f} s)")
    for loss in result.losses:
        say(f"  mismatch policy '{spec.on_mismatch}': {printable(loss.describe())}")
    if result.lambdas:
        for row in result.lambdas:
            r = row["rho"]
            say(f"  {printable(row['agent'])}: shared {row['shared']:,}  unique {row['unique']:,}  "
                  f"ρ {'inf' if r is None else f'{r:.4f}'}  λ {row['lambda']:.4f}")
    for note in result.notes:
        if note.startswith("WARNING"):
            say(note, file=sys.stderr)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    spec = _spec_from_args(args)
    provenance = None
    if args.preset:
        from merging.methods.presets import provenance as preset_provenance

        provenance = preset_provenance(args.preset, spec.method, spec.params)
    return _run_spec(spec, args, provenance=provenance)


def cmd_run(args: argparse.Namespace) -> int:
    """Re-run a ram_recipe.json, or run a mergekit YAML config (for the methods both tools have)."""
    from merging.recipe import check_local_inputs, is_output_name, read_recipe

    path = Path(args.recipe)
    if _is_yaml(path):
        from merging.interop.mergekit import read_mergekit_yaml

        if not args.out:
            raise RamStudioError("a mergekit config names no output folder.", "Pass --out DIR.")
        try:
            text = path.read_bytes()[:(1 << 20) + 1].decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise RamStudioError(f"cannot read {path} as UTF-8 text ({getattr(exc, 'strerror', None) or 'bad bytes'}).",
                                 "Give a mergekit YAML file.") from None
        config = read_mergekit_yaml(text)
        config.spec.out = args.out
        if args.device:
            config.spec.device = args.device
        for note in config.notes:
            say(f"note: {note}.", file=sys.stderr)
        return _run_spec(config.spec, args, provenance={"mergekit_config": text})
    spec, doc = read_recipe(path)
    check_local_inputs(spec, doc)
    if args.out:
        spec.out = args.out
    elif not is_output_name(spec.out):  # a recipe writes into ./NAME: never a path it names
        raise RamStudioError(f"the recipe's output name {printable(spec.out, 120)!r} is not a plain folder name, "
                             "so it is not used.", "Pass --out DIR to say where to write the merge.")
    if args.device:
        spec.device = args.device
    expected = None if args.allow_changed_inputs else doc.get("inputs", [])
    return _run_spec(spec, args, expected)


def _is_yaml(path: Path) -> bool:
    """A mergekit config (by its name, or by content that is not a JSON object) rather than our recipe."""
    if path.suffix.lower() in (".yml", ".yaml"):
        return True
    if path.is_dir() or path.suffix.lower() == ".json":
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return False
    return bool(head) and not head.startswith(b"{")


def cmd_methods(args: argparse.Namespace) -> int:
    from merging.methods import METHODS

    for m in METHODS.values():
        params = ", ".join(f"{p.name}={p.default}" for p in m.params)
        say(f"{m.name:16s} {m.summary}\n{'':16s} parameters: {params or '-'}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    # tqdm reads its settings once, when first imported: lm-eval's and transformers' bars stay off in this command.
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from ram_studio.evaluate_cmd import build_evaluator, display_frame, progress_printer

    if args.limit is not None and args.limit < 1:
        raise RamStudioError(f"--limit {args.limit} is not a positive number of examples.", "Give --limit 1 or more.")
    evaluator = build_evaluator(args)
    if args.split not in evaluator.splits():
        raise RamStudioError(f"the {evaluator.name} tasks {', '.join(evaluator.tasks)} have no {args.split} split "
                             f"to score.", f"Choose --split {' or '.join(evaluator.splits())}.")
    from merging.reading.checkpoint import open_checkpoint
    from merging.writing.placement import check_output_file, protected_paths, write_file_atomically

    with _stop_on_signal() as stop:
        _prefetch([args.model], args.quiet, stop)
    ckpt = open_checkpoint(args.model)  # safetensors only: a pickle-only or adapter folder is refused here
    if args.lm_eval is None and not args.suite:  # the demo's tasks: the suite the model's config.json names
        evaluator = build_evaluator(args, suite_folder=ckpt.folder)
    out = None
    if args.json:
        inputs = [(ckpt.ref.raw, ckpt.folder)] + ([("--include-path", Path(args.include_path))] if args.include_path else [])
        out = check_output_file(args.json, protected_paths(inputs), overwrite=args.overwrite)
    if args.lm_eval is None:  # the demo's tasks: the model's own tokenizer must fit them
        _refuse_unless_demo_compatible(ckpt)
    loaded = evaluator.load(ckpt.folder)
    with _stop_on_signal() as stop:
        if hasattr(evaluator, "frame"):  # the demo's tasks: the per-subset table too
            t0 = time.perf_counter()
            frame = evaluator.frame(loaded, args.split, limit=args.limit, cancel=stop,
                                    progress=None if args.quiet else progress_printer("evaluate"))
            from assets.demo.evaluator import scores_from_frame

            scores = scores_from_frame(frame, args.split, time.perf_counter() - t0)
        else:
            frame = None
            scores = evaluator.score(loaded, args.split, limit=args.limit, cancel=stop,
                                     progress=None if args.quiet else progress_printer("evaluate"))
    suite = getattr(evaluator, "suite", None)
    say(f"{printable(args.model)} · {evaluator.name}" + (f" (suite {suite.name})" if suite else "") + f" · {args.split} split"
          + (f" · first {args.limit} examples per task" if args.limit else "") + f" · {scores.seconds:.1f} s")
    say(_table(display_frame(frame, scores)))
    say(f"average over {len(scores.scores)} task(s): {scores.average:.2f} %")
    if out is not None:
        doc = {"model": args.model, "folder": str(ckpt.folder), "evaluator": evaluator.name,
               "suite": suite.name if suite else None,
               "fingerprint": evaluator.fingerprint(), "tasks": list(evaluator.tasks), "split": args.split,
               "limit": args.limit, "scores": scores.scores, "average": scores.average, "n": scores.n,
               "detail": scores.detail, "seconds": round(scores.seconds, 3)}
        if frame is not None:
            doc["results"] = frame.to_dict(orient="records")
        write_file_atomically(out, (json.dumps(doc, indent=2) + "\n").encode())
    return 0


def _refuse_unless_demo_compatible(ckpt) -> None:
    """`evaluate` scores with the model's own tokenizer on the demo's tasks: the folder must hold a tokenizer
    (tokenizer.json) whose every token id has a row in the model's embedding, and a causal LM config. Said in
    one line before anything is loaded, never an IndexError from inside the model."""
    from merging.reading.model_folder import MAX_SMALL_FILE, check_file

    name = printable(ckpt.folder)
    hint = ("`evaluate` scores models built from the demo base (its tokenizer and tasks); for other models use an "
            "lm-evaluation-harness task.")
    try:
        ident = check_file(ckpt.folder, "tokenizer.json", max_bytes=MAX_SMALL_FILE)
    except FileNotFoundError:
        raise RamStudioError(f"{name} has no tokenizer.json, so it cannot be scored on the demo's tasks.", hint) from None
    embed = next((e for n, e in ckpt.tensors.items() if n.endswith("embed_tokens.weight") and len(e.shape) == 2), None)
    if embed is None or not (ckpt.config or {}).get("architectures"):
        raise RamStudioError(f"{name} is not a causal language model with token embeddings "
                             "(no embed_tokens.weight, or no architectures in config.json).", hint)
    try:
        from tokenizers import Tokenizer

        size = Tokenizer.from_file(str(ident.path)).get_vocab_size(with_added_tokens=True)
    except Exception:  # noqa: BLE001 — the tokenizers library raises its own exception type
        raise RamStudioError(f"{name}/tokenizer.json could not be read as a tokenizer.", hint) from None
    if size == 0 or size > embed.shape[0]:
        raise RamStudioError(f"{name} is not a demo-compatible model: its tokenizer has {size:,} tokens and its "
                             f"embedding {embed.shape[0]:,} rows.", hint)


def _sweep_printer(quiet: bool):
    """Sweep progress on stderr: phase, scorings done, the one running and its examples, elapsed."""
    from merging.common.units import format_seconds

    tty = sys.stderr.isatty()
    last = {"done": -1, "phase": ""}

    def show(p) -> None:
        if quiet:
            return
        phase = {"open": "opening", "select": "selection split", "report": "report split", "done": "done"}[p.phase]
        now = f"  {printable(p.current, 100)}" if p.current else ""
        examples = f" ({p.examples_done}/{p.examples_total})" if p.examples_total and p.phase != "open" else ""
        line = f"sweep: {phase} {p.done}/{p.total} scored{examples}{now}  [{format_seconds(p.elapsed)}]"
        if tty:
            sys.stderr.write("\r\033[K" + line + ("\n" if p.phase == "done" else ""))
        elif p.done != last["done"] or p.phase != last["phase"]:
            sys.stderr.write(line + "\n")
        last.update(done=p.done, phase=p.phase)
        sys.stderr.flush()

    return show


def _local_folder(ref: str) -> Path | None:
    """The folder a model reference names when it is on this machine already (nothing is downloaded)."""
    from merging.reading.refs import resolve

    try:
        return resolve(ref, download=False)
    except RamStudioError:
        return None


def cmd_sweep(args: argparse.Namespace) -> int:
    """Score merge candidates, choose per method on validation, report the chosen on test (evaluation/sweep.py)."""
    # tqdm reads its settings once, when first imported: lm-eval's and transformers' bars stay off, as in evaluate.
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from evaluation.grid import parse_try, read_grid_file, stages
    from evaluation.keep import KEEP, check_root, keep_models
    from evaluation.sweep import SweepSpec, check_agents, check_splits

    grids = [parse_try(t) for t in args.try_ or []]
    for path in args.grids or []:
        grids += read_grid_file(path)
    stages(grids)  # empty grids, unknown or circular @METHOD references: refused before anything runs
    if args.limit is not None and args.limit <= 0:
        raise RamStudioError("--limit must be a positive number of examples per task.", "E.g. --limit 50.")
    if args.keep not in KEEP:
        raise RamStudioError(f"unknown --keep {args.keep!r}.", f"Use one of {', '.join(KEEP)}.")
    import functools

    from ram_studio.evaluate_cmd import build_evaluator

    make_evaluator = functools.partial(build_evaluator, args, suite_folder=_local_folder(args.base))
    evaluator = make_evaluator()  # the demo's tasks follow the suite the base names; bad options: one line
    check_splits(evaluator, args.select_on, args.report_on)
    check_agents(grids, list(args.agents))
    from merging.writing.placement import check_output_file, input_folders, protected_paths

    protected = input_folders([args.base, *args.agents])
    if args.include_path:
        protected += protected_paths([("--include-path", Path(args.include_path))])
    outputs = {}
    for flag, path in (("json", args.json), ("csv", args.csv)):
        if path:
            outputs[flag] = check_output_file(path, protected, overwrite=args.overwrite)
    root = Path(args.out)
    if args.keep != "none":
        check_root(root, args.base, list(args.agents))
    from evaluation.executors import EXECUTORS
    from evaluation.report import csv_bytes, result_frame, result_json, summary_lines
    from evaluation.store import ScoreStore
    from evaluation.sweep import run_sweep
    from merging.writing.placement import write_file_atomically

    spec = SweepSpec(args.base, list(args.agents), grids, evaluator, args.select_on, args.report_on, args.limit,
                     args.on_mismatch, args.device, args.inputs, references=not args.no_references,
                     make_evaluator=make_evaluator)
    store = ScoreStore(read=not args.no_resume)
    executor = EXECUTORS[args.executor]()
    entries = []

    def progress(p) -> None:
        entries[:] = p.entries
        show(p)

    show = _sweep_printer(args.quiet)
    with _stop_on_signal() as stop:
        _prefetch([args.base, *args.agents], args.quiet, stop)
        try:
            res = run_sweep(spec, executor, store=store, progress=progress, cancel=stop)
        except Cancelled:
            fresh = sum(1 for e in entries if not e.resumed)
            raise Cancelled(f"sweep interrupted: {len(entries)} scoring(s) kept ({fresh} new) in {store.folder}; "
                            "nothing else was written.", "Run the same command again to resume from them.") from None
        kept = keep_models(res, args.keep, root, overwrite=args.overwrite, cancel=stop) if args.keep != "none" else []
    for line in summary_lines(res):
        print(line)
    for k in kept:
        print(f"kept {k.out}")
    if "json" in outputs:
        doc = result_json(res, executor.name)
        doc["kept"] = [str(k.out) for k in kept]
        write_file_atomically(outputs["json"], (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode())
        print(f"wrote {outputs['json']}")
    if "csv" in outputs:
        write_file_atomically(outputs["csv"], csv_bytes(result_frame(res)))
        print(f"wrote {outputs['csv']}")
    return 0


def build_parser(method_flags_for_merge: bool = True) -> argparse.ArgumentParser:
    """The parser; without `method_flags_for_merge` the merge command lacks its method flags, which
    saves importing the methods (and torch) for the other commands and for `--help`."""
    from merging.methods.presets import PRESETS

    p = argparse.ArgumentParser(prog=PROG, description="RAM Studio: analyse and merge RL-trained agents.")
    sub = p.add_subparsers(dest="command", required=True)

    def models(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("base", help="base model: folder, org/name[@revision] or demo:base")
        sp.add_argument("agents", nargs="*", help="agent models (same forms)")
        sp.add_argument("--on-mismatch", choices=["error", "base"], default="error",
                        help="what to do when agents differ from the base (see README)")

    sp = sub.add_parser("inspect", help="compatibility report from safetensors headers only")
    models(sp)
    sp.add_argument("--json", help="also write the report as JSON")
    sp.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    sp.set_defaults(func=cmd_inspect)

    sp = sub.add_parser("analyze", help="task-vector statistics for a ladder of ε (one streaming pass)")
    models(sp)
    sp.add_argument("--eps-ladder", help="comma-separated ε values (default 0,1e-7,1e-6,3e-6,1e-5,3e-5,1e-4,1e-3)")
    sp.add_argument("--eps", type=float, default=1e-5, help="ε for the printed summary")
    sp.add_argument("--json", help="write per-agent summaries for every ε as JSON")
    sp.add_argument("--csv", help="write the full per-tensor table as CSV (one row per agent × tensor × ε)")
    sp.add_argument("--pairs-csv", help="write the per-tensor pair diagnostics as CSV (one row per pair of agents "
                                        "× tensor × ε: elements both changed, same sign, Σ τ_a·τ_b, Σ τ_a², Σ τ_b²)")
    sp.add_argument("--overwrite", action="store_true", help="replace existing --json/--csv/--pairs-csv files")
    sp.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    sp.add_argument("--no-cache", action="store_true", help="recompute even if a cached result exists")
    sp.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    sp.set_defaults(func=cmd_analyze)

    def writing(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--overwrite", action="store_true",
                        help="replace an existing output folder written by RAM Studio (nothing else is replaced)")
        sp.add_argument("--allow-noop", action="store_true",
                        help="write the merge even if it changes nothing (refused by default)")
        sp.add_argument("--quiet", action="store_true", help=QUIET_HELP)

    sp = sub.add_parser("merge", help="merge and export a Hugging Face folder")
    models(sp)
    sp.add_argument("--method", help="merge method (see `methods`); or a --preset")
    sp.add_argument("--preset", choices=list(PRESETS),
                    help="a named setting: paper (RAM+, r 0.1, α 2); authors-default (the RAM authors' script's "
                         "default mode: ram_plus, r = R − 1, α = 1); authors-soft (its older mode: ram_plus_soft, "
                         "r = R − 1); mergekit-ramplus-tl (r 0.1, α 0.2, per-tensor ρ). ε and the other flags "
                         "stay free; a flag that contradicts the preset is an error")
    sp.add_argument("--rescale-factor", type=float, metavar="R",
                    help="the authors' script's --rescale_factor R for the authors-* presets (default 1.05, the "
                         "script's; its README uses 1.2); r = R − 1")
    sp.add_argument("--out", required=True, help="output folder (written atomically)")
    if method_flags_for_merge:
        method_flags(sp)
    sp.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    sp.add_argument("--shard-size", default="5GB", metavar="SIZE",
                    help="largest weight file of the output: shards of at most SIZE (e.g. 500MB, 2GB) with a model.safetensors.index.json; default 5GB, as transformers' save_pretrained")
    sp.add_argument("--out-dtype", help="output dtype (default: the base's): bfloat16, float16, float32, float64")
    sp.add_argument("--chunk-elems", type=int, default=1 << 23, help=argparse.SUPPRESS)
    writing(sp)
    sp.set_defaults(func=cmd_merge)

    sp = sub.add_parser("run", help="re-run a merge from its ram_recipe.json, or run a mergekit YAML config")
    sp.add_argument("recipe", metavar="RECIPE_OR_CONFIG",
                    help="a ram_recipe.json (or the folder holding one), or a mergekit config (*.yml / *.yaml)")
    sp.add_argument("--out", help="output folder (required for a mergekit config; for a recipe the default is "
                                  "./NAME, the recipe's output folder name)")
    sp.add_argument("--device", help="override the device: auto, cpu or cuda")
    sp.add_argument("--allow-changed-inputs", action="store_true",
                    help="merge even if the inputs' content differs from what the recipe recorded")
    writing(sp)
    sp.set_defaults(func=cmd_run)

    sp = sub.add_parser("download", help="download Hub models into the Hugging Face cache, with progress "
                                         "(resumes an interrupted download)")
    sp.add_argument("models", nargs="+", help="Hub ids: org/name or org/name@revision")
    sp.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    sp.set_defaults(func=cmd_download)

    sp = sub.add_parser("methods", help="list merge methods and their parameters")
    sp.set_defaults(func=cmd_methods)

    sp = sub.add_parser("sweep", help="score merge candidates: choose each method's best on validation, report the "
                                      "chosen on test", description="Merge every candidate in memory and score it "
                        "on the selection split; each method's best (by average) is then scored on the report split, "
                        "next to the base and the agents. Scores are kept as they come: an interrupted sweep resumes.")
    models(sp)
    sp.add_argument("--try", dest="try_", action="append", metavar='"METHOD name=v1,v2 name=v3"',
                    help="a grid: a method and values per parameter (repeat for more grids); a value @METHOD takes "
                         "that method's chosen value, e.g. \"dare_ta lambda=@task_arithmetic drop_rate=0.1,0.5\"")
    sp.add_argument("--grids", action="append", metavar="FILE.yaml", help="grids from a YAML file (grids: [...])")
    from ram_studio.evaluate_cmd import add_evaluator_options

    add_evaluator_options(sp)  # --tasks | --lm-eval [--include-path], --suite, --backend, --device, --batch-size
    sp.add_argument("--select-on", default="validation", help="the split candidates are chosen on (never test)")
    sp.add_argument("--report-on", default="test", help="the split the chosen candidates are reported on")
    sp.add_argument("--limit", type=int, help="score at most N examples per task and split")
    sp.add_argument("--keep", default="none", metavar="best|all|none",
                    help="which models to write: the best overall, all scored, or none (default)")
    sp.add_argument("--out", default="merged-models", help="folder for kept models (default ./merged-models)")
    sp.add_argument("--executor", choices=["local", "ray"], default="local",
                    help="local (this process) or ray (Ray tasks: one worker per GPU, else per CPU; joins $RAY_ADDRESS)")
    sp.add_argument("--json", help="write every score as JSON")
    sp.add_argument("--csv", help="write the tidy table as CSV")
    sp.add_argument("--overwrite", action="store_true", help="replace existing --json/--csv files and kept folders")
    sp.add_argument("--no-resume", action="store_true", help="score everything again (new scores are still stored)")
    sp.add_argument("--no-references", action="store_true", help="do not score the base and the agents")
    sp.add_argument("--inputs", choices=["auto", "resident", "stream"], default="auto", help=argparse.SUPPRESS)
    sp.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    sp.set_defaults(func=cmd_sweep)

    sp = sub.add_parser("evaluate", help="score a model on the demo's tasks or on lm-evaluation-harness tasks",
                        description="Score one model: on the demo's code/tool/memory tasks (greedy decoding, the "
                                    "tasks' verifiers), or with --lm-eval on lm-evaluation-harness tasks. Accuracy "
                                    "in %.")
    sp.add_argument("model", help="model: folder, org/name[@revision] or demo:NAME (demo:base, demo:tool, …)")
    from ram_studio.evaluate_cmd import add_evaluator_options

    add_evaluator_options(sp)
    sp.add_argument("--split", default="test", metavar="validation|test",
                    help="which split to score (default test); lm-eval: validation scores each task's TASK_validation "
                         "companion or its own validation split")
    sp.add_argument("--limit", type=int, default=None, metavar="N",
                    help="score only the first N examples of each task (a quick look; not comparable to full scores)")
    sp.add_argument("--json", metavar="FILE", help="also write the scores as JSON (the placement rules of analyze "
                                                  "--json: never inside an input, never over a file without --overwrite)")
    sp.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    sp.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    sp.set_defaults(func=cmd_evaluate)
    return p


@contextlib.contextmanager
def _stop_on_signal() -> Iterator[threading.Event]:
    """During a long pass, SIGINT/SIGTERM set a flag the engine polls between chunks, so the stop
    happens at a safe point (an exception raised inside a numba compile or a parallel kernel can
    leave the process hanging); a second signal interrupts at once."""
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt(f"signal {signum}")
        stop.set()

    if threading.current_thread() is not threading.main_thread():  # signals only reach the main thread
        yield stop
        return
    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (the first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: one clear line on stderr and a non-zero exit for every user error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(method_flags_for_merge=_command(argv) == "merge")
    args = parser.parse_args(argv)
    if "chunk_elems" in args and args.chunk_elems <= 0:
        parser.error("--chunk-elems must be positive")
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM cleans up like Ctrl-C
    try:
        if isinstance(getattr(args, "agents", None), list):
            from merging.recipe import check_agent_count

            check_agent_count(len(args.agents))  # before any agent is looked at
        return args.func(args)
    except (MergeCancelled, KeyboardInterrupt):
        say("error: interrupted; nothing was written.", file=sys.stderr)
        return 130
    except Cancelled as exc:  # e.g. a download: what was kept, and that the next run resumes
        say(f"error: {exc}", file=sys.stderr)
        return 130
    except RamStudioError as exc:
        say(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f": {printable(exc.filename, 200)}" if exc.filename else ""
        say(f"error: {printable(exc.strerror or exc)}{where}.", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def run() -> NoReturn:
    """The command's process entry point: `main()`, then an exit that skips the interpreter's teardown of
    every loaded module (with torch and numba loaded, 0.5–0.9 s of each command's wall time) after doing what
    matters of a normal exit, in its order: threading's shutdown (executors told to stop, non-daemon threads
    joined), atexit handlers, flushing stdout/stderr. Every file a command writes is closed (outputs also
    synced) before `main` returns."""
    code = main()
    try:
        try:
            threading._shutdown()  # what the interpreter calls first at exit (private, in every CPython 3)
        except BaseException as exc:  # e.g. Ctrl-C while a thread is still finishing: said, then the rest
            say(f"error: exit interrupted ({type(exc).__name__}) while waiting for threads.", file=sys.stderr)
            code = code or 130
        atexit._run_exitfuncs()  # reports a failing handler itself and goes on
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said
                code = code or 1
        os._exit(code)

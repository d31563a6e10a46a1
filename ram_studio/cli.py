"""Command line: `ram-studio inspect | analyze | merge | run | evaluate | methods`.

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
import threading
import time
from pathlib import Path
from typing import Iterator, NoReturn, Sequence

from merging.errors import Cancelled, MergeCancelled, RamStudioError, printable

PROG = "ram-studio"


def _progress_printer(label: str):
    """A compact progress line on stderr: percent, bytes, tensors, ETA."""
    from merging.units import format_bytes, format_seconds

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

    from merging.units import format_bytes, format_seconds

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
    from merging.units import format_bytes

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
    from merging.refs import hub_repos

    hub = hub_repos(list(refs))
    if not hub:
        return
    from merging.hub import download, offline_mode, plan_download

    if offline_mode():
        return  # the command says what is missing from the cache
    plan = plan_download(hub)
    if plan.remaining == 0:
        return
    if not quiet:
        for line in _describe_plan(plan):
            print(f"download: {line}", file=sys.stderr)
    download(plan, progress=None if quiet else _download_printer(), cancel=stop)


def cmd_download(args: argparse.Namespace) -> int:
    from merging.hub import download, plan_download
    from merging.refs import hub_repos

    plan = plan_download(hub_repos(list(args.models)))
    if not plan.repos:
        raise RamStudioError("no Hugging Face repo ids given.", "Give ids like org/name or org/name@revision.")
    for line in _describe_plan(plan):
        print(line)
    if plan.remaining == 0:
        return 0
    with _stop_on_signal() as stop:
        folders = download(plan, progress=None if args.quiet else _download_printer(), cancel=stop)
    for repo_id, folder in folders.items():
        print(f"{printable(repo_id)}: {folder}")
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
    from merging.placement import check_output_file, protected_paths

    return check_output_file(path, protected_paths([(c.ref.raw, c.folder) for c in checkpoints]), overwrite=overwrite)


def cmd_inspect(args: argparse.Namespace) -> int:
    from merging.checkpoint import open_checkpoint
    from merging.compat import ModelHeaders, check_compatibility
    from merging.placement import write_file_atomically

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
    print(_table(frame))
    if report.ok:
        print("\ncompatible: same architecture, tensor names, shapes and dtypes.")
        return 0
    print(f"\n{len(report.mismatches)} difference(s) from the base:")
    print(_table(report.mismatches_frame()))
    if args.on_mismatch == "base":
        for loss in report.losses():
            if loss.dropped or loss.padded:
                print(f"  policy 'base': {printable(loss.describe())}")
    report.enforce(args.on_mismatch)
    print(f"\nall differences are handled by --on-mismatch {args.on_mismatch}.")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from analysis.ladder import DEFAULT_LADDER
    from analysis.stats import analyze
    from merging.checkpoint import open_checkpoint
    from merging.placement import write_file_atomically

    with _stop_on_signal() as stop:
        _prefetch([args.base, *args.agents], args.quiet, stop)
    base = open_checkpoint(args.base)
    agents = [open_checkpoint(a) for a in args.agents]
    json_out = _file_output(args.json, [base, *agents], args.overwrite)
    csv_out = _file_output(args.csv, [base, *agents], args.overwrite)
    ladder = _ladder(args.eps_ladder) if args.eps_ladder else list(DEFAULT_LADDER)
    with _stop_on_signal() as stop:
        result = analyze(base, agents, ladder=ladder, device=args.device, policy=args.on_mismatch,
                         use_cache=not args.no_cache, progress=None if args.quiet else _progress_printer("analyze"),
                         cancel=stop)
    from analysis.tables import agents_json, global_density, rho_table  # pandas: only once there are results

    eps = args.eps if args.eps in result.ladder else (1e-5 if 1e-5 in result.ladder else result.ladder[-1])
    table = global_density(result, eps).merge(rho_table(result, eps)[["agent", "rho"]], on="agent")
    table["density"] = (100 * table["density"]).map("{:.3f} %".format)
    print(f"ε = {eps:g}; {result.total_params:,} parameters; "
          f"{'from cache' if result.from_cache else f'{result.seconds:.1f} s'}")
    print(_table(table[["agent", "changed", "shared", "unique", "density", "rho"]]))
    if json_out:
        doc = {"eps": list(result.ladder), "total_params": result.total_params, "base": result.base,
               "agents": agents_json(result), "fingerprint": result.fingerprint, "seconds": result.seconds}
        write_file_atomically(json_out, (json.dumps(doc, indent=2) + "\n").encode())
    if csv_out:
        write_file_atomically(csv_out, result.frame.to_csv(index=False).encode())
    return 0


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


def _spec_from_args(args: argparse.Namespace):
    from merging.dtypes import parse_out_dtype
    from merging.recipe import MergeSpec

    return MergeSpec(base=args.base, agents=list(args.agents), method=args.method, params=params_from_args(args),
                     out=args.out, out_dtype=parse_out_dtype(args.out_dtype) if args.out_dtype else None,
                     shard_size=args.shard_size, device=args.device, on_mismatch=args.on_mismatch,
                     chunk_elems=args.chunk_elems)


def _cached_counts(spec) -> dict | None:
    """Whole-model counts at the method's ε from a cached analysis of the same inputs, if there is one."""
    from analysis.stats import cached_counts
    from merging.methods import get_method

    method = get_method(spec.method)
    eps = method.global_counts_eps(method.resolve_params(spec.params))
    return None if eps is None else cached_counts(spec.base, spec.agents, eps, spec.on_mismatch)


def _run_spec(spec, args: argparse.Namespace, expected_inputs=None, provenance=None) -> int:
    from merging.export import merge_to_folder
    from merging.units import format_bytes

    with _stop_on_signal() as stop:
        _prefetch([spec.base, *spec.agents], args.quiet, stop)
        result = merge_to_folder(spec, overwrite=args.overwrite, allow_noop=args.allow_noop,
                                 expected_inputs=expected_inputs, counts=_cached_counts(spec), provenance=provenance,
                                 progress=None if args.quiet else _progress_printer("merge"),
                                 count_progress=None if args.quiet else _progress_printer("count"), cancel=stop)
    print(f"wrote {result.out} ({format_bytes(result.bytes_written)} in {len(result.files)} files, "
          f"{result.seconds:.1f} s)")
    for loss in result.losses:
        print(f"  mismatch policy '{spec.on_mismatch}': {printable(loss.describe())}")
    if result.lambdas:
        for row in result.lambdas:
            r = row["rho"]
            print(f"  {printable(row['agent'])}: shared {row['shared']:,}  unique {row['unique']:,}  "
                  f"ρ {'inf' if r is None else f'{r:.4f}'}  λ {row['lambda']:.4f}")
    if any(n.startswith("WARNING") for n in result.notes):
        print("WARNING: this merge changes nothing: the weights equal the base's.", file=sys.stderr)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    return _run_spec(_spec_from_args(args), args)


def cmd_run(args: argparse.Namespace) -> int:
    """Re-run a ram_recipe.json, or run a mergekit YAML config (for the methods both tools have)."""
    from merging.recipe import read_recipe

    path = Path(args.recipe)
    if _is_yaml(path):
        from merging.mergekit_config import read_mergekit_yaml

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
            print(f"note: {note}.", file=sys.stderr)
        return _run_spec(config.spec, args, provenance={"mergekit_config": text})
    spec, doc = read_recipe(path)
    if args.out:
        spec.out = args.out
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
        print(f"{m.name:16s} {m.summary}\n{'':16s} parameters: {params or '-'}")
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
    from merging.checkpoint import open_checkpoint
    from merging.placement import check_output_file, protected_paths, write_file_atomically

    with _stop_on_signal() as stop:
        _prefetch([args.model], args.quiet, stop)
    ckpt = open_checkpoint(args.model)  # safetensors only: a pickle-only or adapter folder is refused here
    if args.lm_eval is None and not args.suite:  # the demo's tasks: the suite the model's config.json names
        evaluator = build_evaluator(args, suite_folder=ckpt.folder)
    out = None
    if args.json:
        inputs = [(ckpt.ref.raw, ckpt.folder)] + ([("--include-path", Path(args.include_path))] if args.include_path else [])
        out = check_output_file(args.json, protected_paths(inputs), overwrite=args.overwrite)
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
    print(f"{printable(args.model)} · {evaluator.name}" + (f" (suite {suite.name})" if suite else "") + f" · {args.split} split"
          + (f" · first {args.limit} examples per task" if args.limit else "") + f" · {scores.seconds:.1f} s")
    print(_table(display_frame(frame, scores)))
    print(f"average over {len(scores.scores)} task(s): {scores.average:.2f} %")
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


def build_parser(method_flags_for_merge: bool = True) -> argparse.ArgumentParser:
    """The parser; without `method_flags_for_merge` the merge command lacks its method flags, which
    saves importing the methods (and torch) for the other commands and for `--help`."""
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
    sp.add_argument("--csv", help="write the full per-tensor table as CSV")
    sp.add_argument("--overwrite", action="store_true", help="replace existing --json/--csv files")
    sp.add_argument("--device", default="auto")
    sp.add_argument("--no-cache", action="store_true", help="recompute even if a cached result exists")
    sp.add_argument("--quiet", action="store_true")
    sp.set_defaults(func=cmd_analyze)

    def writing(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--overwrite", action="store_true",
                        help="replace an existing output folder written by RAM Studio (nothing else is replaced)")
        sp.add_argument("--allow-noop", action="store_true",
                        help="write the merge even if it changes nothing (refused by default)")
        sp.add_argument("--quiet", action="store_true")

    sp = sub.add_parser("merge", help="merge and export a Hugging Face folder")
    models(sp)
    sp.add_argument("--method", required=True, help="merge method (see `methods`)")
    sp.add_argument("--out", required=True, help="output folder (written atomically)")
    if method_flags_for_merge:
        method_flags(sp)
    sp.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    sp.add_argument("--shard-size", default="5GB")
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
    sp.add_argument("--quiet", action="store_true")
    sp.set_defaults(func=cmd_download)

    sp = sub.add_parser("methods", help="list merge methods and their parameters")
    sp.set_defaults(func=cmd_methods)

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
    sp.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
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
        return args.func(args)
    except (MergeCancelled, KeyboardInterrupt):
        print("error: interrupted; nothing was written.", file=sys.stderr)
        return 130
    except Cancelled as exc:  # e.g. a download: what was kept, and that the next run resumes
        print(f"error: {exc}", file=sys.stderr)
        return 130
    except RamStudioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f": {printable(exc.filename, 200)}" if exc.filename else ""
        print(f"error: {printable(exc.strerror or exc)}{where}.", file=sys.stderr)
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
            print(f"error: exit interrupted ({type(exc).__name__}) while waiting for threads.", file=sys.stderr)
            code = code or 130
        atexit._run_exitfuncs()  # reports a failing handler itself and goes on
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said
                code = code or 1
        os._exit(code)

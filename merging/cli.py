"""Command-line interface: `python -m merging inspect | analyze | merge | run | evaluate | methods`."""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Iterator, Sequence

from .errors import MergeCancelled, RamStudioError


def _progress_printer(label: str):
    """A compact progress line on stderr: percent, bytes, tensors, ETA."""
    tty = sys.stderr.isatty()

    def show(p) -> None:
        eta = f", ETA {p.eta:5.0f}s" if p.eta is not None else ""
        line = (f"{label}: {100 * p.fraction:5.1f}%  {p.done / 1e9:7.2f}/{p.total / 1e9:.2f} GB  "
                f"tensors {p.tensors_done}/{p.tensors_total}{eta}")
        if tty:
            sys.stderr.write("\r" + line)
            if p.done >= p.total:
                sys.stderr.write("\n")
        elif p.done >= p.total:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    return show


def _ladder(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RamStudioError(f"cannot read --eps-ladder {text!r}.", "Use comma-separated numbers, e.g. 0,1e-6,1e-5.")


def cmd_inspect(args: argparse.Namespace) -> int:
    from .checkpoint import open_checkpoint
    from .compat import ModelHeaders, check_compatibility

    base = open_checkpoint(args.base)
    agents = [open_checkpoint(a) for a in args.agents]
    report = check_compatibility(ModelHeaders.from_checkpoint(base), [ModelHeaders.from_checkpoint(a) for a in agents])
    if args.json:
        doc = {"models": report.models_frame().to_dict(orient="records"),
               "mismatches": report.mismatches_frame().to_dict(orient="records")}
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    frame = report.models_frame()
    frame["GB"] = (frame.pop("bytes_on_disk") / 1e9).round(3)
    print(frame.to_string(index=False))
    if report.ok:
        print("\ncompatible: same architecture, tensor names, shapes and dtypes.")
        return 0
    print(f"\n{len(report.mismatches)} mismatch(es):")
    print(report.mismatches_frame().to_string(index=False))
    report.enforce(args.on_mismatch)
    print(f"\nall mismatches are handled by --on-mismatch {args.on_mismatch}.")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from analysis.overlap import DEFAULT_LADDER
    from analysis.stats import analyze
    from analysis.views import agents_json, global_density, rho_table

    ladder = _ladder(args.eps_ladder) if args.eps_ladder else list(DEFAULT_LADDER)
    with _stop_on_signal() as stop:
        result = analyze(args.base, args.agents, ladder=ladder, device=args.device, policy=args.on_mismatch,
                         use_cache=not args.no_cache, progress=None if args.quiet else _progress_printer("analyze"),
                         cancel=stop)
    eps = args.eps if args.eps in result.ladder else (1e-5 if 1e-5 in result.ladder else result.ladder[-1])
    table = global_density(result, eps).merge(rho_table(result, eps)[["agent", "rho"]], on="agent")
    table["density"] = (100 * table["density"]).map("{:.3f} %".format)
    print(f"ε = {eps:g}; {result.total_params:,} parameters; "
          f"{'from cache' if result.from_cache else f'{result.seconds:.1f} s'}")
    print(table[["agent", "changed", "shared", "unique", "density", "rho"]].to_string(index=False))
    if args.json:
        doc = {"eps": list(result.ladder), "total_params": result.total_params, "base": result.base,
               "agents": agents_json(result), "fingerprint": result.fingerprint, "seconds": result.seconds}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    if args.csv:
        result.frame.to_csv(args.csv, index=False)
    return 0


def _spec_from_args(args: argparse.Namespace):
    from .dtypes import parse_out_dtype
    from .recipe import MergeSpec

    params = {"eps": args.eps, "r": args.r, "alpha": args.alpha, "rho_scope": args.rho_scope,
              "lambda": args.lambda_, "density": args.density, "drop_rate": args.drop_rate, "seed": args.seed,
              "agent": args.agent, "dilute": args.dilute}
    return MergeSpec(base=args.base, agents=list(args.agents), method=args.method,
                     params={k: v for k, v in params.items() if v is not None}, out=args.out,
                     out_dtype=parse_out_dtype(args.out_dtype) if args.out_dtype else None,
                     shard_size=args.shard_size, device=args.device, on_mismatch=args.on_mismatch,
                     chunk_elems=args.chunk_elems)


def _run_spec(spec, overwrite: bool, quiet: bool) -> int:
    from .export import merge_to_folder

    with _stop_on_signal() as stop:
        result = merge_to_folder(spec, overwrite=overwrite,
                                 progress=None if quiet else _progress_printer("merge"),
                                 analysis_progress=None if quiet else _progress_printer("analyze"), cancel=stop)
    print(f"wrote {result.out} ({result.bytes_written / 1e9:.3f} GB in {len(result.files)} files, "
          f"{result.seconds:.1f} s)")
    if result.lambdas:
        for row in result.lambdas:
            r = row["rho"]
            print(f"  {row['agent']}: shared {row['shared']:,}  unique {row['unique']:,}  "
                  f"ρ {'inf' if r is None else f'{r:.4f}'}  λ {row['lambda']:.4f}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    return _run_spec(_spec_from_args(args), args.overwrite, args.quiet)


def cmd_run(args: argparse.Namespace) -> int:
    from .recipe import read_recipe

    spec, _doc = read_recipe(Path(args.recipe))
    if args.out:
        spec.out = args.out
    return _run_spec(spec, args.overwrite, args.quiet)


def cmd_methods(args: argparse.Namespace) -> int:
    from .methods import METHODS

    for m in METHODS.values():
        params = ", ".join(f"{p.name}={p.default}" for p in m.params if p.name != "rule")
        print(f"{m.name:16s} {m.summary}\n{'':16s} parameters: {params or '-'}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .refs import resolve

    try:
        from assets.demo import evaluate as demo_eval
    except ImportError:
        raise RamStudioError("the demo evaluation module is not installed.", "Check assets/demo.") from None
    folder = resolve(args.model)
    argv = [str(folder), "--tasks", args.tasks, "--split", args.split]
    if args.json:
        argv += ["--json", args.json]
    if args.limit:
        argv += ["--limit", str(args.limit)]
    return int(demo_eval.main(argv) or 0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m merging", description="RAM Studio: analyse and merge RL-trained agents.")
    sub = p.add_subparsers(dest="command", required=True)

    def models(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("base", help="base model: folder, org/name[@revision] or demo:base")
        sp.add_argument("agents", nargs="*", help="agent models (same forms)")
        sp.add_argument("--on-mismatch", choices=["error", "base"], default="error",
                        help="what to do when agents differ from the base (see README)")

    sp = sub.add_parser("inspect", help="compatibility report from safetensors headers only")
    models(sp)
    sp.add_argument("--json", help="also write the report as JSON")
    sp.set_defaults(func=cmd_inspect)

    sp = sub.add_parser("analyze", help="task-vector statistics for a ladder of ε (one streaming pass)")
    models(sp)
    sp.add_argument("--eps-ladder", help="comma-separated ε values (default 0,1e-7,1e-6,3e-6,1e-5,3e-5,1e-4,1e-3)")
    sp.add_argument("--eps", type=float, default=1e-5, help="ε for the printed summary")
    sp.add_argument("--json", help="write per-agent summaries for every ε as JSON")
    sp.add_argument("--csv", help="write the full per-tensor table as CSV")
    sp.add_argument("--device", default="auto")
    sp.add_argument("--no-cache", action="store_true", help="recompute even if a cached result exists")
    sp.add_argument("--quiet", action="store_true")
    sp.set_defaults(func=cmd_analyze)

    sp = sub.add_parser("merge", help="merge and export a Hugging Face folder")
    models(sp)
    sp.add_argument("--method", required=True, help="merge method (see `python -m merging methods`)")
    sp.add_argument("--out", required=True, help="output folder (written atomically)")
    sp.add_argument("--eps", type=float)
    sp.add_argument("--r", type=float)
    sp.add_argument("--alpha", type=float)
    sp.add_argument("--rho-scope", choices=["global", "tensor"])
    sp.add_argument("--lambda", dest="lambda_", type=float)
    sp.add_argument("--density", type=float)
    sp.add_argument("--drop-rate", type=float)
    sp.add_argument("--seed", type=int)
    sp.add_argument("--agent", help="unique_only: which agent's unique region to keep")
    sp.add_argument("--dilute", action="store_const", const=True, help="unique_only: divide by N")
    sp.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    sp.add_argument("--shard-size", default="5GB")
    sp.add_argument("--out-dtype", help="output dtype (default: the base's), e.g. bfloat16 or float32")
    sp.add_argument("--chunk-elems", type=int, default=1 << 23, help=argparse.SUPPRESS)
    sp.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    sp.add_argument("--quiet", action="store_true")
    sp.set_defaults(func=cmd_merge)

    sp = sub.add_parser("run", help="re-run a merge from its ram_recipe.json")
    sp.add_argument("recipe")
    sp.add_argument("--out", help="write here instead of the recipe's output folder")
    sp.add_argument("--overwrite", action="store_true")
    sp.add_argument("--quiet", action="store_true")
    sp.set_defaults(func=cmd_run)

    sp = sub.add_parser("methods", help="list merge methods and their parameters")
    sp.set_defaults(func=cmd_methods)

    sp = sub.add_parser("evaluate", help="score a model on the demo's code/tool/memory tasks")
    sp.add_argument("model")
    sp.add_argument("--tasks", default="code,tool,memory")
    sp.add_argument("--split", default="test")
    sp.add_argument("--limit", type=int)
    sp.add_argument("--json")
    sp.set_defaults(func=cmd_evaluate)
    return p


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: one clear line on stderr and a non-zero exit for every user error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if "chunk_elems" in args and args.chunk_elems <= 0:
        parser.error("--chunk-elems must be positive")
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM cleans up like Ctrl-C
    try:
        return args.func(args)
    except MergeCancelled:
        print("error: interrupted; nothing was written.", file=sys.stderr)
        return 130
    except RamStudioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; nothing was written.", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"error: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}.", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)

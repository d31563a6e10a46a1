"""`ram-studio merge`: merge a base and its agents with a method (or a preset) and export a Hugging Face folder. The
method flags are generated from the methods' parameter declarations; `run_spec` is shared with `run`."""
from __future__ import annotations

import argparse
import sys

from merging.common.errors import RamStudioError, printable
from ram_studio.console import QUIET_HELP, progress_printer, say, stop_on_signal
from ram_studio.inputs import add_model_arguments, prefetch


def add_parser(sub, method_flags_for_merge: bool = True) -> None:
    """The `merge` subcommand; without `method_flags_for_merge` it lacks the method flags (saves importing torch)."""
    from merging.presets import PRESETS  # light: names and numbers only

    sp = sub.add_parser("merge", help="merge and export a Hugging Face folder")
    add_model_arguments(sp)
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
                    help="largest weight file of the output: shards of at most SIZE (e.g. 500MB, 2GB) with a "
                         "model.safetensors.index.json; default 5GB, as transformers' save_pretrained")
    sp.add_argument("--out-dtype", help="output dtype (default: the base's): bfloat16, float16, float32, float64")
    sp.add_argument("--chunk-elems", type=int, default=1 << 23, help=argparse.SUPPRESS)
    sp.add_argument("--vocab", choices=["base", "union"], default="base",
                    help="base: keep the base's vocabulary (an agent that adds tokens is refused, or its tokens "
                         "dropped under --on-mismatch base); union: when every agent's tokenizer extends the base's, "
                         "keep every added token (its rows from the agents that added it) and write the union "
                         "tokenizer")
    sp.add_argument("--untie", action="store_true",
                    help="for a tied base whose agents stored an explicit lm_head untied by training: write an "
                         "untied head (merged from the base's embeddings and each agent's head) and "
                         "tie_word_embeddings false")
    from ram_studio.commands.fisher_options import add_fisher_options

    add_fisher_options(sp)
    add_writing_options(sp)
    sp.set_defaults(func=cmd_merge)


def add_writing_options(sp: argparse.ArgumentParser) -> None:
    """--overwrite, --allow-noop and --quiet, as `merge` and `run` take them."""
    sp.add_argument("--overwrite", action="store_true",
                    help="replace an existing output folder written by RAM Studio (nothing else is replaced)")
    sp.add_argument("--allow-noop", action="store_true",
                    help="write the merge even if it changes nothing (refused by default)")
    sp.add_argument("--quiet", action="store_true", help=QUIET_HELP)


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
        from merging.presets import apply_preset

        return apply_preset(args.preset, args.method, given, args.rescale_factor)
    if args.rescale_factor is not None:
        raise RamStudioError("--rescale-factor goes with --preset authors-default or authors-soft.",
                             "E.g. --preset authors-default --rescale-factor 1.2, or set --r yourself.")
    if not args.method:
        raise RamStudioError("no merge method given.", "Pass --method NAME (see `methods`) or --preset NAME.")
    return args.method, given


def spec_from_args(args: argparse.Namespace):
    from merging.common.dtypes import parse_out_dtype
    from merging.recipe import MergeSpec

    method, params = _method_and_params(args)
    return MergeSpec(base=args.base, agents=list(args.agents), method=method, params=params,
                     out=args.out, out_dtype=parse_out_dtype(args.out_dtype) if args.out_dtype else None,
                     shard_size=args.shard_size, device=args.device, on_mismatch=args.on_mismatch,
                     chunk_elems=args.chunk_elems, vocab=args.vocab, untie=args.untie)


def cached_statistics(spec) -> tuple[dict | None, dict | None]:
    """Counts for global ρ and the diagnostics for the card, from a cached analysis of the same inputs."""
    from analysis.stats import cached_result

    if spec.untie:  # an analysis covers the base's tensors: the untied head's counts are not among them
        return None, None
    result = cached_result(spec.base, spec.agents, spec.on_mismatch)
    if result is None:
        return None, None
    from analysis.agreement import merge_statistics

    return merge_statistics(result, spec.method, spec.params)


def side_for(spec, args: argparse.Namespace, stop, fisher_record=None, quiet: bool = False):
    """The side tensors the spec's method reads (each agent's Fisher for `fisher`: from the flags, or from a recipe's
    record, whose cache keys must then match unless --allow-changed-inputs), else None."""
    from merging.methods import get_method
    from ram_studio.commands import fisher_options as fo

    if get_method(spec.method).side_tensors != "fisher":
        fo.given_origin(args, False)  # refuses Fisher flags given to another method
        return None
    if fisher_record is not None:
        origin, tasks, keys = fo.recorded_origin(fisher_record)
        keys = None if getattr(args, "allow_changed_inputs", False) else keys
    else:
        (origin, tasks), keys = fo.given_origin(args, True), None
    from ram_studio.commands.evaluator_options import progress_printer, quiet_library_progress

    quiet_library_progress()
    return fo.fisher_side(spec, origin, tasks, progress=None if quiet else progress_printer("fisher"), cancel=stop,
                          recorded_keys=keys)


def run_spec(spec, args: argparse.Namespace, expected_inputs=None, provenance=None, fisher_record=None) -> int:
    from merging.common.units import format_bytes
    from merging.merge import merge_to_folder

    with stop_on_signal() as stop:
        prefetch([spec.base, *spec.agents], args.quiet, stop)
        side = side_for(spec, args, stop, fisher_record, args.quiet)
        counts, overlap = cached_statistics(spec)
        result = merge_to_folder(spec, overwrite=args.overwrite, allow_noop=args.allow_noop, side=side,
                                 expected_inputs=expected_inputs, counts=counts, provenance=provenance, overlap=overlap,
                                 warn=lambda message: say(f"warning: {message}", file=sys.stderr),
                                 progress=None if args.quiet else progress_printer("merge"),
                                 count_progress=None if args.quiet else progress_printer("count"), cancel=stop)
    say(f"wrote {result.out} ({format_bytes(result.bytes_written)} in {len(result.files)} files, "
          f"{result.seconds:.1f} s)")
    for note in [*result.handling, *result.precision]:
        say(f"note: {printable(note)}", file=sys.stderr)
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
    """Merge with --method and its flags or a --preset, recording the preset in the recipe."""
    spec = spec_from_args(args)
    provenance = None
    if args.preset:
        from merging.presets import provenance as preset_provenance

        provenance = preset_provenance(args.preset, spec.method, spec.params)
    return run_spec(spec, args, provenance=provenance)

"""`ram-studio inspect`: the compatibility report of a base and its agents, from safetensors headers only."""
from __future__ import annotations

import argparse
import json

from merging.common.errors import printable
from ram_studio.console import say, stop_on_signal, table
from ram_studio.inputs import add_model_arguments, file_output, prefetch


def add_parser(sub) -> None:
    """The `inspect` subcommand and its options."""
    sp = sub.add_parser("inspect", help="compatibility report from safetensors headers only")
    add_model_arguments(sp)
    sp.add_argument("--json", help="also write the report as JSON")
    sp.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    sp.set_defaults(func=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    """Open the base and agents, print the compatibility table and the differences, apply --on-mismatch."""
    from merging.reading.checkpoint import open_checkpoint
    from merging.reading.compat import ModelHeaders, check_compatibility
    from merging.writing.checked_output import write_file_atomically

    with stop_on_signal() as stop:
        prefetch([args.base, *args.agents], False, stop)
    base = open_checkpoint(args.base)
    agents = [open_checkpoint(a) for a in args.agents]
    out = file_output(args.json, [base, *agents], args.overwrite)
    report = check_compatibility(ModelHeaders.from_checkpoint(base), [ModelHeaders.from_checkpoint(a) for a in agents])
    if out:
        doc = {"models": report.models_frame().to_dict(orient="records"),
               "mismatches": report.mismatches_frame().to_dict(orient="records"),
               "losses": [loss.__dict__ for loss in report.losses()]}
        write_file_atomically(out, (json.dumps(doc, indent=2, default=str) + "\n").encode())
    frame = report.models_frame()
    frame["GB"] = (frame.pop("bytes_on_disk") / 1e9).round(3)
    say(table(frame))
    if report.ok:
        say("\ncompatible: same architecture, tensor names, shapes and dtypes.")
        return 0
    say(f"\n{len(report.mismatches)} difference(s) from the base:")
    say(table(report.mismatches_frame()))
    if args.on_mismatch == "base":
        for loss in report.losses():
            if loss.dropped or loss.padded:
                say(f"  policy 'base': {printable(loss.describe())}")
    report.enforce(args.on_mismatch)
    say(f"\nall differences are handled by --on-mismatch {args.on_mismatch}.")
    return 0

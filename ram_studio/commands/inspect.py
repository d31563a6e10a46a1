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
    """Open the base and agents, print the compatibility table, the differences, how tied heads and added tokens
    are handled and the lineage warnings, then apply --on-mismatch."""
    import sys

    from merging.reading.checkpoint import open_checkpoint
    from merging.reading.prepare import prepare_inputs
    from merging.reading.structure import structure_of
    from merging.writing.checked_output import write_file_atomically

    with stop_on_signal() as stop:
        prefetch([args.base, *args.agents], False, stop)
    base = open_checkpoint(args.base)
    agents = [open_checkpoint(a) for a in args.agents]
    out = file_output(args.json, [base, *agents], args.overwrite)
    prep = prepare_inputs(base, agents, policy=args.on_mismatch)
    for line in prep.warnings():  # before the tables: they decide whether the rest means anything
        say(line, file=sys.stderr)
    report = prep.report
    structure = structure_of(base.tensors)
    if out:
        doc = {"models": report.models_frame().to_dict(orient="records"),
               "mismatches": report.mismatches_frame().to_dict(orient="records"),
               "losses": [loss.__dict__ for loss in report.losses()],
               "notes": prep.notes, "warnings": [w.__dict__ for w in prep.lineage],
               "lineage_samples": [{"agent": label, "elements": s.elements, "density": s.density,
                                    "rel_norm": s.rel_norm} for label, s in zip(prep.labels, prep.samples)],
               "structure": structure.summary(), "unknown_tensors": structure.unknown,
               "layouts": [{"agent": a, "mapping": line} for a, line in report.layout_notes()]}
        write_file_atomically(out, (json.dumps(doc, indent=2, default=str) + "\n").encode())
    frame = report.models_frame()
    frame["GB"] = (frame.pop("bytes_on_disk") / 1e9).round(3)
    say(table(frame))
    say("\nstructure of the base: " + printable("; ".join(structure.summary()), 2000))
    for agent, line in report.layout_notes():
        say(f"layout: {printable(agent)}: {printable(line, 400)}")
    for note in prep.notes:
        say(f"note: {printable(note)}")
    refusal = prep.vocab.refusal if prep.vocab else None
    if report.ok and refusal is None:
        mapped = " (read in the base's layout)" if report.layout_notes() else ""
        say(f"\ncompatible: same architecture, tensor names, shapes and dtypes{mapped}.")
        return 0
    if not report.ok:
        say(f"\n{len(report.mismatches)} difference(s) from the base:")
        mm = report.mismatches_frame()
        say(table(mm.assign(tensor=mm["tensor"].fillna("—"))))  # a whole-model difference names no tensor
    if args.on_mismatch == "base":
        for loss in report.losses():
            if loss.dropped or loss.padded:
                say(f"  policy 'base': {printable(loss.describe())}")
    prep.enforce(args.on_mismatch)
    say(f"\nall differences are handled by --on-mismatch {args.on_mismatch}.")
    return 0

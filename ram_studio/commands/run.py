"""`ram-studio run`: re-run a merge from its ram_recipe.json, or run a mergekit YAML config (for the methods both
tools have)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from merging.common.errors import RamStudioError, printable
from ram_studio.commands.merge import add_writing_options, run_spec
from ram_studio.console import say


def add_parser(sub) -> None:
    """The `run` subcommand and its options."""
    sp = sub.add_parser("run", help="re-run a merge from its ram_recipe.json, or run a mergekit YAML config")
    sp.add_argument("recipe", metavar="RECIPE_OR_CONFIG",
                    help="a ram_recipe.json (or the folder holding one), or a mergekit config (*.yml / *.yaml)")
    sp.add_argument("--out", help="output folder (required for a mergekit config; for a recipe the default is "
                                  "./NAME, the recipe's output folder name)")
    sp.add_argument("--device", help="override the device: auto, cpu or cuda")
    sp.add_argument("--allow-changed-inputs", action="store_true",
                    help="merge even if the inputs' content differs from what the recipe recorded")
    add_writing_options(sp)
    sp.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """Re-run a ram_recipe.json, or run a mergekit YAML config (for the methods both tools have)."""
    from merging.recipe import check_local_inputs, is_output_name, read_recipe

    path = Path(args.recipe)
    if _is_yaml(path):
        return _run_mergekit_config(path, args)
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
    return run_spec(spec, args, expected, fisher_record=doc.get("fisher"))


def _run_mergekit_config(path: Path, args: argparse.Namespace) -> int:
    """Translate a mergekit YAML config (at most 1 MiB of UTF-8) into our spec and merge it into --out."""
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
    return run_spec(config.spec, args, provenance={"mergekit_config": text})


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

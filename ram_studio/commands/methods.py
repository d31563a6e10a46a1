"""`ram-studio methods`: the merge methods and their parameters."""
from __future__ import annotations

import argparse

from ram_studio.console import say


def add_parser(sub) -> None:
    """The `methods` subcommand."""
    sp = sub.add_parser("methods", help="list merge methods and their parameters")
    sp.set_defaults(func=cmd_methods)


def cmd_methods(args: argparse.Namespace) -> int:
    """Each registered method with its summary and its parameters' defaults."""
    from merging.methods import METHODS

    for m in METHODS.values():
        params = ", ".join(f"{p.name}={p.default}" for p in m.params)
        say(f"{m.name:16s} {m.summary}\n{'':16s} parameters: {params or '-'}")
    return 0

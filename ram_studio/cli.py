"""Command line: `ram-studio inspect | analyze | merge | run | download | methods | sweep | evaluate`.

Each command is one module in ram_studio/commands/ (its subparser and its handler); this module builds the parser
and turns errors into one line and an exit status. Method flags (--eps, --r, --lambda, …) are generated from the
methods' parameter declarations. Heavy modules are imported inside the commands, so `--help` and argument errors
answer at once.
"""
from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import threading
from typing import NoReturn, Sequence

from merging.common.errors import Cancelled, MergeCancelled, RamStudioError, printable
from ram_studio.commands import analyze, download, evaluate, inspect, merge, methods, run as run_cmd, sweep
from ram_studio.console import say

PROG = "ram-studio"


def build_parser(method_flags_for_merge: bool = True) -> argparse.ArgumentParser:
    """The parser; without `method_flags_for_merge` the merge command lacks its method flags, which
    saves importing the methods (and torch) for the other commands and for `--help`."""
    p = argparse.ArgumentParser(prog=PROG, description="RAM Studio: analyse and merge RL-trained agents.")
    sub = p.add_subparsers(dest="command", required=True)
    inspect.add_parser(sub)
    analyze.add_parser(sub)
    merge.add_parser(sub, method_flags_for_merge)
    run_cmd.add_parser(sub)
    download.add_parser(sub)
    methods.add_parser(sub)
    sweep.add_parser(sub)
    evaluate.add_parser(sub)
    return p


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

"""Command line: `ram-studio inspect | analyze | merge | run | download | methods | sweep | evaluate | tasks`.

Each command is one module in ram_studio/commands/ (its subparser and its handler); this module builds the parser
and turns errors into one line and an exit status. Method flags (--eps, --r, --lambda, …) are generated from the
methods' parameter declarations. Heavy modules are imported inside the commands, so `--help` and argument errors
answer at once.
"""
from __future__ import annotations

import argparse
import gc
import signal
import sys
from typing import NoReturn, Sequence

from merging.common.errors import Cancelled, MergeCancelled, RamStudioError, printable
from merging.common.threads import openmp_waits_passively
from ram_studio.commands import analyze, download, evaluate, inspect, merge, methods, sweep, tasks
from ram_studio.commands import run as run_cmd
from ram_studio.console import say

PROG = "ram-studio"


def build_parser(method_flags_for_merge: bool = True) -> argparse.ArgumentParser:
    """The parser; without `method_flags_for_merge` the merge command lacks its method flags, which
    saves importing the methods (and torch) for the other commands and for `--help`."""
    from ram_studio import __version__

    p = argparse.ArgumentParser(prog=PROG, description="RAM Studio: analyse and merge RL-trained agents.")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    inspect.add_parser(sub)
    analyze.add_parser(sub)
    merge.add_parser(sub, method_flags_for_merge)
    run_cmd.add_parser(sub)
    download.add_parser(sub)
    methods.add_parser(sub)
    sweep.add_parser(sub)
    evaluate.add_parser(sub)
    tasks.add_parser(sub)
    return p


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (the first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: one clear line on stderr and a non-zero exit for every user error."""
    openmp_waits_passively()  # a command starts here: before any command loads torch or numba
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
    """The command's process entry point: `main()`, then the interpreter's normal exit (`sys.exit`: executors told
    to stop, non-daemon threads joined, atexit handlers run, output flushed), made quick and uninterruptible.
    Every file a command writes is closed (outputs also synced) before `main` returns, and the command's own
    threads are daemons or already joined, so nothing is left to wait for but the interpreter's teardown."""
    code = main()
    for stream in (sys.stdout, sys.stderr):  # what the command said arrives, whatever happens next
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said
            code = code or 1
    # From here on Ctrl-C or SIGTERM ends the process at once (their default action) instead of raising
    # KeyboardInterrupt into the interpreter's shutdown, where it would print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # The shutdown's garbage collections then skip every object alive now (torch's and numba's modules): most of
    # the teardown's time. Nothing is lost: the process's memory goes back to the system as it ends.
    gc.freeze()
    sys.exit(code)

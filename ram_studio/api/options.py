"""Keywords to a command's options: the Python API takes the CLI's flags as keywords (`--rho-scope` is
`rho_scope`, `--no-cache` is `no_cache`) and runs them through the CLI's own parser, so defaults, choices and
type checks are the CLI's, and a wrong value is the same one-line RamStudioError."""
from __future__ import annotations

import argparse
import contextlib
import io
import os
from typing import Any, Iterable, Mapping

from merging.common.errors import RamStudioError, printable

# Options of the CLI that the API does not take as keywords: progress goes through `progress=`, and the hidden
# flags (argparse.SUPPRESS: tuning knobs for tests) stay off the public interface.
NOT_KEYWORDS = {"help", "quiet"}
ALIASES = {"lambda": "lambda_", "try": "try_"}  # Python keywords: `lambda=` can only come through **{...}


def subparser(command: str, method_flags: bool = False) -> argparse.ArgumentParser:
    """The CLI's parser of one command (merge with its generated method flags when asked)."""
    from ram_studio.cli import build_parser

    sub = next(a for a in build_parser(method_flags)._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def keyword_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The options a command takes as keywords: dest → action (positionals, hidden flags and --quiet left out)."""
    return {a.dest: a for a in parser._actions
            if a.option_strings and a.dest not in NOT_KEYWORDS and a.help != argparse.SUPPRESS}


def model_refs(models: Any, what: str) -> list[str]:
    """A model or a list of models (str or os.PathLike) as the references the CLI takes."""
    items = [models] if isinstance(models, (str, os.PathLike)) else models
    if not isinstance(items, Iterable):
        raise RamStudioError(f"{what} must be a model reference or a list of them, not {type(models).__name__}.",
                             "Give a folder, a Hub id (org/name) or a demo model (demo:code).")
    refs = []
    for m in items:
        if not isinstance(m, (str, os.PathLike)):
            raise RamStudioError(f"{what} holds a {type(m).__name__}, not a model reference.",
                                 "Give a folder, a Hub id (org/name) or a demo model (demo:code).")
        refs.append(os.fspath(m))
    return refs


def _words(action: argparse.Action, value: Any, name: str) -> list[str]:
    """The command-line words for one keyword's value."""
    flag = action.option_strings[0]
    if isinstance(action, argparse.BooleanOptionalAction):
        return [flag if value else "--no-" + flag[2:]]
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise RamStudioError(f"{name}={printable(repr(value), 80)} must be True or False.", "")
        return [flag] if value is (isinstance(action, argparse._StoreTrueAction)) else []
    many = isinstance(value, (list, tuple))
    items = list(value) if many else [value]
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int, float, os.PathLike)):
            raise RamStudioError(f"{name}={printable(repr(value), 80)} is not a value this option takes.",
                                 "Give a string, a number or a path" + (", or a list of them." if many else "."))
    texts = [os.fspath(i) if isinstance(i, os.PathLike) else str(i) for i in items]
    if isinstance(action, argparse._AppendAction):
        return [w for t in texts for w in (flag, t)]
    return [flag, ",".join(texts)]


def to_argv(command: str, positionals: list[str], options: Mapping[str, Any],
            actions: Mapping[str, argparse.Action]) -> list[str]:
    """The command line the keywords stand for (None and False options left out; '--' before the models)."""
    words = [command]
    for name, value in options.items():
        dest = ALIASES.get(name, name)
        if dest not in actions:
            known = ", ".join(sorted(actions))
            raise RamStudioError(f"{command}() got an unknown keyword {printable(name, 60)!r}.",
                                 f"It takes {known}.")
        if value is None or (value is False and not isinstance(actions[dest], argparse.BooleanOptionalAction)):
            continue
        words += _words(actions[dest], value, name)
    return words + ["--", *positionals]


def parse(command: str, positionals: list[str], options: Mapping[str, Any],
          method_flags: bool = False) -> argparse.Namespace:
    """The Namespace the CLI would build for these keywords; argparse's complaint becomes a RamStudioError."""
    from ram_studio.cli import build_parser

    parser = build_parser(method_flags)
    actions = keyword_actions(subparser(command, method_flags))
    argv = to_argv(command, positionals, options, actions)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = parser.parse_args(argv)
    except SystemExit:
        line = next((ln for ln in reversed(said.getvalue().splitlines()) if "error:" in ln), said.getvalue().strip())
        raise RamStudioError(line.split("error:", 1)[-1].strip().rstrip(".") + ".",
                             f"See help(ram_studio.{command}) or `ram-studio {command} --help`.") from None
    args.quiet = True  # the API reports progress through its callback, never on stderr
    if isinstance(getattr(args, "agents", None), list):
        from merging.recipe import check_agent_count

        check_agent_count(len(args.agents))
    return args

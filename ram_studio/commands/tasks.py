"""`ram-studio tasks`: the demo's tasks (each declared once, in demo/tasks/) and its task suites."""
from __future__ import annotations

import argparse

from ram_studio.console import say


def add_parser(sub) -> None:
    """The `tasks` subcommand."""
    sp = sub.add_parser("tasks", help="list the demo's tasks and task suites",
                        description="The demo's tasks — what `evaluate --tasks` and `sweep --tasks` accept — with "
                                    "their decoding budgets and how they are reported, and the task suites.")
    sp.set_defaults(func=cmd_tasks)


def cmd_tasks(args: argparse.Namespace) -> int:
    """Each demo task with its summary, budget and subsets; then each suite."""
    from demo.suites import SUITES
    from demo.tasks import TASKS, declared

    for name in TASKS:
        task = declared(name)
        report = "overall and per subset" if task.by_subset else "overall"
        say(f"{name:10s} {task.summary}\n{'':10s} up to {task.max_new_tokens} new tokens; accuracy {report}")
    say("")
    for suite in SUITES.values():
        say(f"suite {suite.name}: {suite.description}")
    return 0

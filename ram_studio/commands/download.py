"""`ram-studio download`: Hub models into the Hugging Face cache, with progress (resumes an interrupted download)."""
from __future__ import annotations

import argparse

from merging.common.errors import RamStudioError, printable
from ram_studio.console import QUIET_HELP, say, stop_on_signal
from ram_studio.inputs import describe_plan, download_printer


def add_parser(sub) -> None:
    """The `download` subcommand and its options."""
    sp = sub.add_parser("download", help="download Hub models into the Hugging Face cache, with progress "
                                         "(resumes an interrupted download)")
    sp.add_argument("models", nargs="+", help="Hub ids: org/name or org/name@revision")
    sp.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    sp.set_defaults(func=cmd_download)


def cmd_download(args: argparse.Namespace) -> int:
    """Plan the download (files, size, free space), then fetch what is missing with progress."""
    from merging.reading.hub import download, plan_download
    from merging.reading.refs import hub_repos

    plan = plan_download(hub_repos(list(args.models)))
    if not plan.repos:
        raise RamStudioError("no Hugging Face repo ids given.", "Give ids like org/name or org/name@revision.")
    for line in describe_plan(plan):
        say(line)
    if plan.remaining == 0:
        return 0
    with stop_on_signal() as stop:
        folders = download(plan, progress=None if args.quiet else download_printer(), cancel=stop)
    for repo_id, folder in folders.items():
        say(f"{printable(repo_id)}: {folder}")
    return 0

"""`python -m demo.explore`: list the configurations, warm up bases, train agents and trios, run the
probes, print the mechanisms table."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

from ..suites import SUITES
from ..tasks import TASKS
from . import __doc__ as PACKAGE_DOC
from .configs import BASES, EXPLORE_SUITES, PROBE_ARCHS, RECIPES, REPO_ROOT, RESULTS, TRIOS
from .probes import probe, reachable
from .runs import ensure_base, run_agent, run_trio
from .tables import markdown_table


def _work(args: argparse.Namespace) -> Path:
    return Path(args.work).resolve()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.explore",
                                     description=PACKAGE_DOC.splitlines()[0])
    parser.add_argument("--work", default=str(REPO_ROOT / ".explore"),
                        help="scratch folder for bases and agents (not committed)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    b = sub.add_parser("base")
    b.add_argument("names", nargs="+", choices=sorted(BASES))
    t = sub.add_parser("trio")
    t.add_argument("ids", nargs="+", choices=list(TRIOS))
    sub.add_parser("table")
    g = sub.add_parser("agent", help="train one agent with a named recipe (cached)")
    g.add_argument("base", choices=sorted(BASES))
    g.add_argument("agent", choices=list(TASKS))
    g.add_argument("recipes", nargs="+", choices=list(RECIPES))
    pr = sub.add_parser("probe", help="short clean warm-up: is memory retrieval learned?")
    pr.add_argument("names", nargs="+", choices=list(PROBE_ARCHS))
    pr.add_argument("--steps", type=int, default=1400)
    pr.add_argument("--lr", type=float, default=2e-3)
    pr.add_argument("--suite", default="demo", choices=[*SUITES, *EXPLORE_SUITES])
    r = sub.add_parser("reach")
    r.add_argument("names", nargs="+", choices=sorted(BASES))
    r.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    work = _work(args)
    if args.cmd == "list":
        for name, spec in BASES.items():
            print(f"base {name}: {spec.description}")
        for trio in TRIOS.values():
            print(f"trio {trio.id} (base {trio.base}): {trio.mechanism} {trio.recipes}")
    elif args.cmd == "base":
        for name in args.names:
            ensure_base(work, name)
    elif args.cmd == "trio":
        for tid in args.ids:
            run_trio(work, TRIOS[tid])
    elif args.cmd == "agent":
        for recipe in args.recipes:
            run_agent(work, args.base, args.agent, recipe)
    elif args.cmd == "probe":
        for name in args.names:
            probe(name, args.steps, args.lr, suite_name=args.suite)
    elif args.cmd == "reach":
        for name in args.names:
            reachable(work, name, args.steps)
    else:
        print(markdown_table(pd.read_csv(RESULTS / "mechanisms.csv")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

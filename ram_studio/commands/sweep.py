"""`ram-studio sweep`: score merge candidates, choose each method's best on validation, report the chosen on test
(the sweep itself: evaluation/sweep.py)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from merging.common.errors import Cancelled, RamStudioError, printable
from ram_studio.commands.evaluator_options import add_evaluator_options, quiet_library_progress
from ram_studio.console import QUIET_HELP, stop_on_signal
from ram_studio.inputs import add_model_arguments, local_folder, prefetch


def add_parser(sub) -> None:
    """The `sweep` subcommand and its options."""
    sp = sub.add_parser("sweep", help="score merge candidates: choose each method's best on validation, report the "
                                      "chosen on test", description="Merge every candidate in memory and score it "
                        "on the selection split; each method's best (by average) is then scored on the report split, "
                        "next to the base and the agents. Scores are kept as they come: an interrupted sweep resumes.")
    add_model_arguments(sp)
    sp.add_argument("--try", dest="try_", action="append", metavar='"METHOD name=v1,v2 name=v3"',
                    help="a grid: a method and values per parameter (repeat for more grids); a value @METHOD takes "
                         "that method's chosen value, e.g. \"dare_ta lambda=@task_arithmetic drop_rate=0.1,0.5\"")
    sp.add_argument("--grids", action="append", metavar="FILE.yaml", help="grids from a YAML file (grids: [...])")
    add_evaluator_options(sp)  # --tasks | --lm-eval [--include-path], --suite, --backend, --device, --batch-size
    sp.add_argument("--fisher-tasks", default=None, metavar="TASK[,TASK]",
                    help="for fisher candidates: each agent's own task among the evaluator's (demo or lm-eval), in the "
                         "agents' order; default: the task named like the agent (code, or ram_demo_code)")
    sp.add_argument("--select-on", default="validation", help="the split candidates are chosen on (never test)")
    sp.add_argument("--report-on", default="test", help="the split the chosen candidates are reported on")
    sp.add_argument("--limit", type=int, help="score at most N examples per task and split")
    sp.add_argument("--keep", default="none", metavar="best|all|none",
                    help="which models to write: the best overall, all scored, or none (default)")
    sp.add_argument("--out", default="merged-models", help="folder for kept models (default ./merged-models)")
    sp.add_argument("--executor", choices=["local", "ray"], default="local",
                    help="local (this process) or ray (Ray tasks: one worker per GPU, else per CPU; joins the cluster "
                         "$RAY_ADDRESS names, else starts a local instance on loopback only, ended with the sweep)")
    sp.add_argument("--json", help="write every score as JSON")
    sp.add_argument("--csv", help="write the tidy table as CSV")
    sp.add_argument("--overwrite", action="store_true", help="replace existing --json/--csv files and kept folders")
    sp.add_argument("--no-resume", action="store_true", help="score everything again (new scores are still stored)")
    sp.add_argument("--no-references", action="store_true", help="do not score the base and the agents")
    sp.add_argument("--inputs", choices=["auto", "resident", "stream"], default="auto", help=argparse.SUPPRESS)
    sp.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    sp.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    """Score merge candidates, choose per method on validation, report the chosen on test (evaluation/sweep.py)."""
    quiet_library_progress()
    import functools

    from evaluation.keep import check_root
    from evaluation.sweep import SweepSpec, check_agents, check_splits
    from ram_studio.commands.evaluator_options import build_evaluator

    grids = checked_grids(args)
    make_evaluator = functools.partial(build_evaluator, args, suite_folder=local_folder(args.base))
    evaluator = make_evaluator()  # the demo's tasks follow the suite the base names; bad options: one line
    check_splits(evaluator, args.select_on, args.report_on)
    check_agents(grids, list(args.agents))
    outputs = output_files(args)
    root = Path(args.out)
    if args.keep != "none":
        check_root(root, args.base, list(args.agents))
    from evaluation.executors import EXECUTORS

    spec = SweepSpec(args.base, list(args.agents), grids, evaluator, args.select_on, args.report_on, args.limit,
                     args.on_mismatch, args.device, args.inputs, references=not args.no_references,
                     make_evaluator=make_evaluator,
                     fisher_tasks=[t for t in (args.fisher_tasks or "").split(",") if t.strip()] or None)
    executor = EXECUTORS[args.executor]()
    res, kept, failed = _run(spec, executor, args, root)
    _report(res, kept, failed, outputs, executor.name)
    if failed:  # the reports are written, the failure in them: now the one line, exit 2
        n = len(kept) + len(failed)
        raise RamStudioError(f"--keep {args.keep}: {len(failed)} of {n} model(s) could not be written "
                             f"({failed[0].candidate}: {failed[0].error})",
                             "The scores are kept; the reports name what was not written. Run the sweep again "
                             "once the folder is free (it resumes from the stored scores).")
    return 0


def checked_grids(args: argparse.Namespace) -> list:
    """The --try and --grids grids, and --limit and --keep, refused when wrong before anything runs."""
    from evaluation.grid import parse_try, read_grid_file, stages
    from evaluation.keep import KEEP

    grids = [parse_try(t) for t in args.try_ or []]
    for path in args.grids or []:
        grids += read_grid_file(path)
    stages(grids)  # empty grids, unknown or circular @METHOD references: refused before anything runs
    if args.limit is not None and args.limit <= 0:
        raise RamStudioError("--limit must be a positive number of examples per task.", "E.g. --limit 50.")
    if args.keep not in KEEP:
        raise RamStudioError(f"unknown --keep {args.keep!r}.", f"Use one of {', '.join(KEEP)}.")
    return grids


def output_files(args: argparse.Namespace) -> dict[str, Path]:
    """The checked --json and --csv paths: never inside an input (the models, --include-path)."""
    from merging.writing.checked_output import check_output_file
    from merging.writing.placement import input_folders, protected_paths

    protected = input_folders([args.base, *args.agents])
    if args.include_path:
        protected += protected_paths([("--include-path", Path(args.include_path))])
    outputs = {}
    for flag, path in (("json", args.json), ("csv", args.csv)):
        if path:
            outputs[flag] = check_output_file(path, protected, overwrite=args.overwrite)
    return outputs


def _run(spec, executor, args: argparse.Namespace, root: Path):
    """Run the sweep (resuming from stored scores) and keep the models --keep asks for; an interrupt says what
    was kept."""
    from evaluation.keep import folder_for, keep_models, kept_candidates
    from evaluation.ray_local import WorkerLost
    from evaluation.store import ScoreStore
    from evaluation.sweep import run_sweep

    store = ScoreStore(read=not args.no_resume)
    entries = []
    show = _sweep_printer(args.quiet)

    def progress(p) -> None:
        entries[:] = p.entries
        show(p)

    with stop_on_signal() as stop:
        prefetch([args.base, *args.agents], args.quiet, stop)
        try:
            res = run_sweep(spec, executor, store=store, progress=progress, cancel=stop)
        except Cancelled:
            fresh = sum(1 for e in entries if not e.resumed)
            raise Cancelled(f"sweep interrupted: {len(entries)} scoring(s) kept ({fresh} new) in {store.folder}; "
                            "nothing else was written.", "Run the same command again to resume from them.") from None
        except WorkerLost as exc:
            fresh = sum(1 for e in entries if not e.resumed)
            raise RamStudioError(f"{exc.message}; {len(entries)} scoring(s) done so far are kept ({fresh} new) in "
                                 f"{store.folder}.", f"{exc.hint} Run the same command again to resume from them "
                                 "(with fewer workers per machine, or --executor local, if memory ran out).") from None
        failed: list = []
        kept = keep_models(res, args.keep, root, overwrite=args.overwrite, cancel=stop,
                           failures=failed) if args.keep != "none" else []
    written = {os.path.abspath(k.out) for k in kept}
    where = {c.label: out for c in kept_candidates(res, args.keep)
             if (out := os.path.abspath(folder_for(spec.base, spec.agents, c, spec.on_mismatch, root))) in written}
    return res, where, failed


def _report(res, kept: dict[str, str], failed: list, outputs: dict[str, Path], executor_name: str) -> None:
    """The summary, the kept folders (by candidate) and those --keep could not write, and the --json and --csv
    files (which say both)."""
    from evaluation.report import csv_bytes, result_frame, result_json, summary_lines
    from merging.writing.checked_output import write_file_atomically

    for line in summary_lines(res):
        print(line)
    for out in kept.values():
        print(f"kept {printable(out)}")
    for f in failed:
        print(f"not kept {printable(f.candidate, 100)}: {printable(f.error, 300)}")
    if "json" in outputs:
        doc = result_json(res, executor_name)
        doc["kept"] = list(kept.values())
        doc["keep_failed"] = [{"candidate": f.candidate, "out": str(f.out), "error": f.error} for f in failed]
        write_file_atomically(outputs["json"], (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode())
        print(f"wrote {outputs['json']}")
    if "csv" in outputs:
        frame = result_frame(res)
        if kept or failed:  # which candidate's model was written where, or why not
            why = {**kept, **{f.candidate: f"not kept: {f.error}" for f in failed}}
            frame["kept"] = [why.get(label, "") if kind == "candidate" else ""
                             for label, kind in zip(frame["candidate"], frame["kind"])]
        write_file_atomically(outputs["csv"], csv_bytes(frame))
        print(f"wrote {outputs['csv']}")


def _sweep_printer(quiet: bool):
    """Sweep progress on stderr: phase, scorings done, the one running and its examples, elapsed."""
    from merging.common.units import format_seconds

    tty = sys.stderr.isatty()
    last = {"done": -1, "phase": ""}

    def show(p) -> None:
        if quiet:
            return
        phase = {"open": "opening", "select": "selection split", "report": "report split", "done": "done"}[p.phase]
        now = f"  {printable(p.current, 100)}" if p.current else ""
        examples = f" ({p.examples_done}/{p.examples_total})" if p.examples_total and p.phase != "open" else ""
        line = f"sweep: {phase} {p.done}/{p.total} scored{examples}{now}  [{format_seconds(p.elapsed)}]"
        if tty:
            sys.stderr.write("\r\033[K" + line + ("\n" if p.phase == "done" else ""))
        elif p.done != last["done"] or p.phase != last["phase"]:
            sys.stderr.write(line + "\n")
        last.update(done=p.done, phase=p.phase)
        sys.stderr.flush()

    return show

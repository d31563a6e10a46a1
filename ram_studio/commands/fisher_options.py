"""The Fisher data a `merge --method fisher` (or `run` of its recipe) reads: which task each agent was trained on,
and whose tasks (the demo's or lm-evaluation-harness's); the Fisher pass itself is evaluation/fisher.py, its files
are kept in the analysis cache."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from merging.common.errors import RamStudioError, printable

MAX_TASK_NAME = 200


def add_fisher_options(sp: argparse.ArgumentParser) -> None:
    """--fisher-tasks | --fisher-lm-eval [--include-path], --suite: the data of `--method fisher`'s Fisher pass."""
    group = sp.add_argument_group("Fisher data (for --method fisher)")
    group.add_argument("--fisher-tasks", default=None, metavar="TASK[,TASK]",
                       help="each agent's own demo task, in the agents' order (default: the task named like the agent, "
                            "e.g. demo:code → code); its train split feeds the Fisher pass")
    group.add_argument("--fisher-lm-eval", default=None, metavar="TASK[,TASK]",
                       help="each agent's own lm-evaluation-harness task instead (one per agent, in order; its "
                            "training split, else a validation split apart from its test split)")
    group.add_argument("--include-path", default=None, metavar="DIR",
                       help="a folder of lm-eval task YAML files for --fisher-lm-eval")
    group.add_argument("--suite", default=None, metavar="demo|shared",
                       help="the demo's task suite for --fisher-tasks (default: the one the base's config.json names)")


def given_origin(args: argparse.Namespace, method_reads_fisher: bool) -> tuple[dict[str, Any], list[str] | None]:
    """(origin, tasks) from the flags: where the Fisher data comes from, and the tasks named (None: by agent)."""
    given = [getattr(args, k, None) for k in ("fisher_tasks", "fisher_lm_eval", "include_path", "suite")]
    if not method_reads_fisher:
        if any(v is not None for v in given):
            raise RamStudioError("--fisher-tasks, --fisher-lm-eval, --include-path and --suite are the data of "
                                 "--method fisher.", "Drop them, or merge with --method fisher.")
        return {}, None
    tasks, lm_tasks, include, suite = given
    if lm_tasks is not None:
        if tasks is not None or suite is not None:
            raise RamStudioError("--fisher-lm-eval (harness tasks) excludes --fisher-tasks and --suite (demo tasks).",
                                 "Give one of them.")
        return {"backend": "lm-eval", "include_path": include}, _names(lm_tasks)
    if include is not None:
        raise RamStudioError("--include-path is a folder of lm-eval tasks: it goes with --fisher-lm-eval.",
                             "Add --fisher-lm-eval TASKS, or drop --include-path.")
    return {"backend": "demo", "suite": suite}, (_names(tasks) if tasks is not None else None)


def _names(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise RamStudioError("no Fisher task given.", "Name one task per agent, e.g. --fisher-tasks code,tool,memory.")
    return names


def recorded_origin(record: Any) -> tuple[dict[str, Any], list[str], list[str]]:
    """(origin, tasks, cache keys) from a recipe's `fisher` record (untrusted: checked field by field)."""
    bad = RamStudioError("the recipe's fisher record is damaged.", "Recreate the recipe with a merge.")
    if not isinstance(record, dict) or not isinstance(record.get("origin"), dict):
        raise bad
    agents = record.get("agents")
    if not isinstance(agents, list) or not all(isinstance(a, dict) and _short_text(a.get("task"))
                                               and _short_text(a.get("key")) for a in agents):
        raise bad
    origin = record["origin"]
    if origin.get("backend") == "demo" and (origin.get("suite") is None or _short_text(origin.get("suite"))):
        return ({"backend": "demo", "suite": origin.get("suite")}, [a["task"] for a in agents],
                [a["key"] for a in agents])
    if origin.get("backend") == "lm-eval" and (origin.get("include_path") is None
                                              or _short_text(origin["include_path"], 4096)):
        return ({"backend": "lm-eval", "include_path": origin.get("include_path")}, [a["task"] for a in agents],
                [a["key"] for a in agents])
    raise bad


def _short_text(v: Any, limit: int = MAX_TASK_NAME) -> bool:
    return isinstance(v, str) and 0 < len(v) <= limit


def fisher_evaluator(origin: dict[str, Any], tasks: list[str] | None, base_folder: Path | None, device: str):
    """The evaluator that gives the Fisher pass its data and loads the agents (demo or lm-eval)."""
    if origin["backend"] == "lm-eval":
        from evaluation.lm_eval_backend import LmEvalEvaluator

        if not tasks:
            raise RamStudioError("--fisher-lm-eval needs one task per agent.", "E.g. --fisher-lm-eval a_task,b_task.")
        return LmEvalEvaluator(tasks, origin.get("include_path"), backend="hf", device=device)
    from demo.evaluate import suite_of_folder
    from demo.evaluator import DemoEvaluator
    from demo.suites import get_suite

    try:
        suite = get_suite(origin["suite"]) if origin.get("suite") else (
            suite_of_folder(base_folder) if base_folder is not None else get_suite(None))
    except ValueError as exc:
        raise RamStudioError(f"cannot tell the demo task suite for the Fisher: {printable(exc, 120)}.",
                             "Pass --suite demo or --suite shared.") from None
    return DemoEvaluator(suite=suite)


def fisher_side(spec, origin: dict[str, Any], tasks: list[str] | None, *, progress=None, cancel=None,
                recorded_keys: list[str] | None = None):
    """The merge's Fisher side tensors: each agent's Fisher at the spec's N and rule, from the cache or computed;
    with `recorded_keys` (a recipe's), a Fisher that differs from the recorded one is refused."""
    from evaluation.fisher import merge_side
    from merging.common.device import pick_device
    from merging.reading.refs import parse_ref, resolve

    base_folder = resolve(parse_ref(spec.base), download=False)
    evaluator = fisher_evaluator(origin, tasks, base_folder, pick_device(spec.device).type)
    side = merge_side(spec, evaluator, tasks, progress=progress, cancel=cancel)
    if recorded_keys is not None:
        now = [a["key"] for a in side.record["agents"]]
        if now != list(recorded_keys):
            raise RamStudioError("the Fisher this recipe recorded differs from the one computed now (the agents, the "
                                 "tasks' data or the rule changed).",
                                 "Pass --allow-changed-inputs to merge with the Fisher as it is now.")
    return side

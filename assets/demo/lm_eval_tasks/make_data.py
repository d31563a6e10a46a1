"""Write the lm-eval tasks' data (`data/TASK_SPLIT.jsonl`) from the demo's evaluation sets, or check it.

    python -m assets.demo.lm_eval_tasks.make_data [--check]

One JSON object per line, in the evaluation set's order: task, subset, prompt, answer, habit and
max_new_tokens (the demo evaluator's decoding budget for the task, which the metric applies).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..tasks import MAX_NEW_TOKENS, TASKS, eval_set

DATA = Path(__file__).resolve().parent / "data"
SPLITS = ("validation", "test")


def records(task: str, split: str) -> list[dict]:
    """The rows of one task and split, exactly the demo evaluator's examples."""
    return [{"task": e.task, "subset": e.subset, "prompt": e.prompt, "answer": e.answer, "habit": e.habit,
             "max_new_tokens": MAX_NEW_TOKENS[task]} for e in eval_set(task, split)]


def text(task: str, split: str) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records(task, split))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assets.demo.lm_eval_tasks.make_data",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the committed files are current")
    args = parser.parse_args(argv)
    stale = []
    for task in TASKS:
        for split in SPLITS:
            path = DATA / f"{task}_{split}.jsonl"
            want = text(task, split)
            if path.is_file() and path.read_text() == want:
                continue
            stale.append(path.name)
            if not args.check:
                DATA.mkdir(exist_ok=True)
                tmp = path.with_name(f".{path.name}.partial")
                tmp.write_text(want)
                tmp.replace(path)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run python -m assets.demo.lm_eval_tasks.make_data", file=sys.stderr)
        return 1
    print(f"{'checked' if args.check else 'wrote'} {len(TASKS) * len(SPLITS)} files in {DATA}"
          + (f" ({len(stale)} rewritten)" if stale and not args.check else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

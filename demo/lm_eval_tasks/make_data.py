"""Write the lm-eval task files of the demo's tasks — each task's YAML (test and validation versions), the two
groups and their shared settings — and their data (`data/TASK_SPLIT.jsonl`) into `assets/demo/lm_eval_tasks/`,
all from the task declarations in `demo/tasks/`; or check that the committed ones are current.

    python -m demo.lm_eval_tasks.make_data [--check]

Data: one JSON object per line, in the evaluation set's order: task, subset, prompt, answer, habit and
max_new_tokens (the demo evaluator's decoding budget for the task, which the metric applies).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import DATA_DIR
from ..tasks import MAX_NEW_TOKENS, TASKS, eval_set

HERE = DATA_DIR / "lm_eval_tasks"  # the files lm-eval reads, next to the utils.py they name
DATA = HERE / "data"
SPLITS = ("validation", "test")
PREFIX = "ram_demo"  # every lm-eval name of the demo: ram_demo (the group), ram_demo_TASK, ram_demo_TASK_validation
SHARED = f"""# Shared settings of the RAM Studio demo tasks (included by {PREFIX}_*.yaml; not a task itself).
custom_dataset: !function utils.load
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
# generation_kwargs are set per task (greedy, `until: []` = stop only at the end-of-text token, and the task's
# token budget as max_gen_toks): an included dict is replaced, not merged.
process_results: !function utils.process_results
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def records(task: str, split: str) -> list[dict]:
    """The rows of one task and split, exactly the demo evaluator's examples."""
    return [{"task": e.task, "subset": e.subset, "prompt": e.prompt, "answer": e.answer, "habit": e.habit,
             "max_new_tokens": MAX_NEW_TOKENS[task]} for e in eval_set(task, split)]


def text(task: str, split: str) -> str:
    """One data file's text."""
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records(task, split))


def task_yaml(task: str, split: str) -> str:
    """The lm-eval task of one demo task, scored on `split` (test: also names the train split, which a Fisher pass
    reads)."""
    name = f"{PREFIX}_{task}" + ("" if split == "test" else f"_{split}")
    tag = f"{PREFIX}_tasks" if split == "test" else f"{PREFIX}_{split}_tasks"
    splits = "training_split: train\ntest_split: test\n" if split == "test" else f"{split}_split: {split}\n"
    return (f"include: _{PREFIX}.yaml\ntask: {name}\ntag: {tag}\ndataset_kwargs:\n  task: {task}\n{splits}"
            f"generation_kwargs:\n  until: []\n  do_sample: false\n  temperature: 0.0\n"
            f"  max_gen_toks: {MAX_NEW_TOKENS[task]}\n")


def group_yaml(split: str) -> str:
    """The group of every demo task on `split` (the mean of the tasks' accuracies, unweighted)."""
    suffix = "" if split == "test" else f"_{split}"
    members = "".join(f"  - {PREFIX}_{task}{suffix}\n" for task in TASKS)
    return (f"group: {PREFIX}{suffix}\ntask:\n{members}aggregate_metric_list:\n  - metric: acc\n"
            f"    aggregation: mean\n    weight_by_size: false\nmetadata:\n  version: 1.0\n")


def files() -> dict[Path, str]:
    """Every file this module writes, with its text."""
    out = {HERE / f"_{PREFIX}.yaml": SHARED}
    for split in SPLITS:
        suffix = "" if split == "test" else f"_{split}"
        out[HERE / f"{PREFIX}{suffix}.yaml"] = group_yaml(split)
        for task in TASKS:
            out[HERE / f"{PREFIX}_{task}{suffix}.yaml"] = task_yaml(task, split)
            out[DATA / f"{task}_{split}.jsonl"] = text(task, split)
    return out


def leftovers(wanted: dict[Path, str]) -> list[Path]:
    """Task files and data here that no declared task produces (a task renamed or removed): named, never deleted."""
    found = [*HERE.glob(f"{PREFIX}*.yaml"), *DATA.glob("*.jsonl")]
    return sorted(p for p in found if p not in wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.lm_eval_tasks.make_data",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the committed files are current")
    args = parser.parse_args(argv)
    wanted = files()
    stale = []
    for path, want in wanted.items():
        if path.is_file() and path.read_text() == want:
            continue
        stale.append(path.name)
        if not args.check:
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_name(f".{path.name}.partial")
            tmp.write_text(want)
            tmp.replace(path)
    extra = leftovers(wanted)
    if extra:
        print(f"not from any declared task (remove them): {', '.join(p.name for p in extra)}", file=sys.stderr)
    if args.check and (stale or extra):
        if stale:
            print(f"stale: {', '.join(stale)}; run python -m demo.lm_eval_tasks.make_data", file=sys.stderr)
        return 1
    print(f"{'checked' if args.check else 'wrote'} {len(wanted)} files in {HERE}"
          + (f" ({len(stale)} rewritten)" if stale and not args.check else ""))
    return 1 if extra else 0


if __name__ == "__main__":
    sys.exit(main())

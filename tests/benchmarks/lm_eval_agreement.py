"""One-off check: lm-eval (its `hf` model loading the folder itself, as its CLI does) on the demo's task
definitions against the built-in evaluator, for the base and the three agents, both splits, every example.

    python -m tests.benchmarks.lm_eval_agreement [--batch-size 64] [--json FILE]

Uses lm-eval's `simple_evaluate` with a TaskManager over `assets/demo/lm_eval_tasks` only (the CLI would also
index lm-eval's built-in tasks first; the scoring path is the same).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "assets" / "demo" / "models"
TASKS_DIR = ROOT / "assets" / "demo" / "lm_eval_tasks"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.lm_eval_agreement",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--models", default="base,code,tool,memory")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from demo.evaluator import DemoEvaluator

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    demo = DemoEvaluator()
    rows, differ = [], 0
    for name in args.models.split(","):
        builtin = {split: demo.score(demo.load(MODELS / name), split).scores for split in ("validation", "test")}
        for split, suffix in (("validation", "_validation"), ("test", "")):
            tasks = [f"ram_demo_{t}{suffix}" for t in ("code", "tool", "memory")]
            out = simple_evaluate(model="hf", model_args=f"pretrained={MODELS / name},dtype=float32", tasks=tasks,
                                  task_manager=manager, batch_size=args.batch_size, device="cpu", bootstrap_iters=0,
                                  log_samples=False)
            for t in ("code", "tool", "memory"):
                lm = 100 * out["results"][f"ram_demo_{t}{suffix}"]["acc,none"]
                ours = builtin[split][t]
                same = abs(lm - ours) < 1e-9
                differ += not same
                rows.append({"model": name, "split": split, "task": t, "lm_eval": lm, "builtin": ours, "same": same})
                print(f"{name:7s} {split:10s} {t:6s} lm-eval {lm:6.2f}  built-in {ours:6.2f}  "
                      f"{'same' if same else 'DIFFERENT'}",
                      flush=True)
    print(f"{len(rows)} task scores, {differ} different")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if differ == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""The demo evaluator's speed, before and after the fast greedy decoder, side by side in one run.

    python -m tests.benchmarks.evaluator_speed [--before REV] [--repeat 3] [--json FILE]

1. `ram-studio evaluate demo:tool --split test` end to end (a fresh process each time: imports, loading,
   scoring, printing), this tree against the tree at `--before` (extracted with `git archive`), interleaved.
2. Scoring one loaded model on the validation split (what a sweep does per candidate), in this process: the
   fast decoder against the decoding it replaced (transformers' `generate` in length-sorted batches of 64),
   for the base and the three agents; the scores must be equal.
Medians and minimums of wall and CPU time are printed (CPU time is the steadier one on a shared machine; the
load average is recorded). The generate path keeps torch's thread setting, as the evaluator did before.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "assets" / "demo" / "models"


def old_tree(rev: str, into: Path) -> Path:
    """The repository at `rev` (tracked files only), extracted into `into`."""
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def cli_seconds(tree: Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one `ram-studio evaluate demo:tool --split test` in a fresh
    process run from `tree`."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ram_studio", "evaluate", "demo:tool", "--split", "test"],
                          cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def scoring_seconds(repeat: int) -> dict:
    """Validation scoring of a loaded model, fast decoder vs the replaced decoding, per model."""
    from demo import evaluate
    from demo.evaluator import DemoEvaluator
    from demo.generation import greedy_texts, reference_greedy_texts

    ev = DemoEvaluator()
    fast, old, same = [], [], True
    for name in ("base", "code", "tool", "memory"):
        model = ev.load(MODELS / name)
        for _ in range(repeat):
            evaluate.greedy_texts = reference_greedy_texts
            t0, c0 = time.perf_counter(), time.process_time()
            want = ev.score(model, "validation").scores
            old.append((time.perf_counter() - t0, time.process_time() - c0))
            evaluate.greedy_texts = greedy_texts
            t0, c0 = time.perf_counter(), time.process_time()
            got = ev.score(model, "validation").scores
            fast.append((time.perf_counter() - t0, time.process_time() - c0))
            same &= got == want
    return {"fast_wall_cpu": fast, "generate_wall_cpu": old, "same_scores": same}


def summary(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, n={len(xs)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.evaluator_speed",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="ccb1959", help="the revision with the old decoding (default ccb1959)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement")
    parser.add_argument("--json", type=Path, help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    import torch

    result = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "torch_threads": torch.get_num_threads(), "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="evaluator-speed-") as tmp:
        before = old_tree(args.before, Path(tmp))
        new, old = [], []
        for _ in range(args.repeat):  # interleaved, so that load changes hit both alike
            old.append(cli_seconds(before))
            new.append(cli_seconds(ROOT))
    result["cli_test_split"] = {"before_wall_cpu": old, "after_wall_cpu": new}
    for what, i in (("wall", 0), ("CPU", 1)):
        print(f"ram-studio evaluate demo:tool --split test, {what}: before ({args.before}) "
              f"{summary([x[i] for x in old])}; after {summary([x[i] for x in new])}")
    scoring = scoring_seconds(args.repeat)
    result["validation_scoring"] = scoring
    for what, i in (("wall", 0), ("CPU", 1)):
        print(f"score one loaded model on validation (450 examples), {what}: generate "
              f"{summary([x[i] for x in scoring['generate_wall_cpu']])}; fast decoder "
              f"{summary([x[i] for x in scoring['fast_wall_cpu']])}")
    print(f"same scores: {scoring['same_scores']}")
    result["load_after"] = os.getloadavg()
    print(f"load average before {result['load_before']}, after {result['load_after']}; "
          f"{result['cpus']} CPUs, torch threads {result['torch_threads']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if scoring["same_scores"] else 1


if __name__ == "__main__":
    sys.exit(main())

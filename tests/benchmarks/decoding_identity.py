"""One-off full check of the demo evaluator's fast greedy decoder against transformers' `generate`.

Every example of the validation and test splits of the three demo tasks, for the base, the three agents and
a few merges of them (written by `ram-studio merge` into a temporary folder), decoded both ways at each
thread count asked for; prints the differing outputs (there should be none) and the decoding CPU time.

    python -m tests.benchmarks.decoding_identity [--threads 1,2] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "assets" / "demo" / "models"
MERGES = {"task_arithmetic": ["--lambda", "1.0"], "ties": ["--lambda", "1.0", "--density", "0.2"],
          "ram": [], "ram_plus": ["--r", "0.1", "--alpha", "2.0"], "average": []}


def merge_into(tmp: Path) -> dict[str, Path]:
    """The demo's merges of a few methods, through the CLI."""
    out = {}
    for method, flags in MERGES.items():
        folder = tmp / method
        cmd = [sys.executable, "-m", "ram_studio", "merge", str(MODELS / "base"),
               *[str(MODELS / a) for a in ("code", "tool", "memory")], "--method", method,
               "--out", str(folder), "--quiet", *flags]
        subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
        out[f"merge:{method}"] = folder
    return out


def check(folders: dict[str, Path], threads: int) -> dict:
    """Decode every example both ways; counts of examples and of differing outputs per model, split, task."""
    from demo.generation import greedy_texts, reference_greedy_texts
    from demo.modeling import load_checkpoint
    from demo.tasks import MAX_NEW_TOKENS, TASKS, eval_set

    torch.set_num_threads(threads)
    rows, fast_s, ref_s = [], 0.0, 0.0
    for name, folder in folders.items():
        model, tok = load_checkpoint(folder)
        for split in ("validation", "test"):
            for task in TASKS:
                prompts = [e.prompt for e in eval_set(task, split)]
                t0 = time.process_time()
                ref = reference_greedy_texts(model, tok, prompts, MAX_NEW_TOKENS[task])
                t1 = time.process_time()
                got = greedy_texts(model, tok, prompts, MAX_NEW_TOKENS[task])
                t2 = time.process_time()
                ref_s, fast_s = ref_s + t1 - t0, fast_s + t2 - t1
                diff = [i for i, (a, b) in enumerate(zip(ref, got)) if a != b]
                rows.append({"model": name, "split": split, "task": task, "examples": len(prompts),
                             "different": len(diff), "first": [[prompts[i], ref[i], got[i]] for i in diff[:3]]})
                print(f"threads {threads} {name:24s} {split:10s} {task:6s} {len(prompts):3d} examples, "
                      f"{len(diff)} different", flush=True)
    return {"threads": threads, "rows": rows, "examples": sum(r["examples"] for r in rows),
            "different": sum(r["different"] for r in rows), "reference_cpu_s": round(ref_s, 2),
            "fast_cpu_s": round(fast_s, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.decoding_identity",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="torch thread counts to check, comma-separated")
    parser.add_argument("--json", type=Path, help="also write the result as JSON")
    args = parser.parse_args(argv)
    folders = {name: MODELS / name for name in ("base", "code", "tool", "memory")}
    with tempfile.TemporaryDirectory(prefix="decoding-identity-") as tmp:
        folders.update(merge_into(Path(tmp)))
        results = [check(folders, int(n)) for n in args.threads.split(",")]
    for r in results:
        print(f"threads {r['threads']}: {r['examples']} examples over {len(folders)} models, {r['different']} "
              f"different; decoding CPU time {r['reference_cpu_s']} s (generate) vs {r['fast_cpu_s']} s (fast)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(r["different"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

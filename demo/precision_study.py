"""Why are (or aren't) the demo's RL task vectors sparse? A small controlled study.

From the committed base, re-run the coding agent's GRPO (100 steps, as in the build) under different learning
rates and optimizers and measure, per run, how many weights moved at all in fp32, how many moved
by more than ε = 1e-5 in fp32, how many still differ from the base after bf16 storage, and what
the run bought: greedy validation accuracy on its task after bf16 storage (the base's in row 0).

    python -m demo.precision_study [--steps 100] [--out assets/demo/results]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch

from .build import DEMO_DIR, bf16_update_stats
from .evaluate import evaluate_loaded
from .modeling import load_checkpoint
from .train import RLConfig, rl_train

SETTINGS: tuple[tuple[str, float], ...] = (
    ("adam", 1e-4), ("adam", 3e-5), ("adam", 1e-5), ("adam", 1e-6), ("sgd", 1e-1), ("sgd", 1e-2))


def run_one(base: Path, task: str, optimizer: str, lr: float, steps: int) -> dict:
    """One GRPO run from the stored base; returns reward and update-density statistics."""
    policy, tok = load_checkpoint(base)
    start = {k: v.detach().clone() for k, v in policy.named_parameters()}
    rewards: list[float] = []
    rl_train(policy, tok, task, RLConfig(steps=steps, lr=lr, optimizer=optimizer), task,
             lambda rec: rewards.append(rec["mean_reward"]))
    stats = bf16_update_stats(task, start, dict(policy.named_parameters()))  # before the rounding below
    k = max(1, steps // 4)
    return {"task": task, "optimizer": optimizer, "lr": lr, "steps": steps,
            "reward_first": sum(rewards[:k]) / k, "reward_last": sum(rewards[-k:]) / k,
            "val_accuracy": _stored_accuracy(policy, tok, task),
            **{key: v for key, v in stats.items() if key != "agent"}}


def _stored_accuracy(model: torch.nn.Module, tok: object, task: str) -> float:
    """Greedy validation accuracy of the weights as they would be stored (rounded to bf16)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    df = evaluate_loaded(model, tok, (task,), "validation")
    return float(df[df.subset == "all"]["accuracy"].iloc[0])


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: run every setting and write `precision_study.csv`."""
    parser = argparse.ArgumentParser(prog="python -m demo.precision_study")
    parser.add_argument("--base", type=Path, default=DEMO_DIR / "models" / "base")
    parser.add_argument("--task", default="code")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=DEMO_DIR / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    base, tok = load_checkpoint(args.base)
    rows = [{"task": args.task, "optimizer": "none (base)", "lr": 0.0, "steps": 0,
             "val_accuracy": _stored_accuracy(base, tok, args.task)}]
    for optimizer, lr in SETTINGS:
        rows.append(run_one(args.base, args.task, optimizer, lr, args.steps))
        print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "precision_study.csv", index=False)
    print(df.to_string(index=False))
    print(f"[precision_study] {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

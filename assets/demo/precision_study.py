"""Why are (or aren't) the demo's RL task vectors sparse? A small controlled study.

From the committed base, re-run the coding agent's GRPO for a few steps under different learning
rates and optimizers and measure, per run, how many weights moved at all in fp32, how many moved
by more than ε = 1e-5 in fp32, and how many still differ from the base after bf16 storage.

    python -m assets.demo.precision_study [--steps 40] [--out assets/demo/results]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch

from .build import DEMO_DIR, _update_stats
from .modeling import load_checkpoint
from .train import RLConfig, rl_train

SETTINGS: tuple[tuple[str, float], ...] = (
    ("adam", 1e-4), ("adam", 1e-5), ("adam", 1e-6), ("sgd", 1e-1), ("sgd", 1e-2))


def run_one(base: Path, task: str, optimizer: str, lr: float, steps: int) -> dict:
    """One GRPO run from the stored base; returns reward and update-density statistics."""
    policy, tok = load_checkpoint(base)
    start = {k: v.detach().clone() for k, v in policy.named_parameters()}
    rewards: list[float] = []
    rl_train(policy, tok, task, RLConfig(steps=steps, lr=lr, optimizer=optimizer), task,
             lambda rec: rewards.append(rec["mean_reward"]))
    stats = _update_stats(task, start, dict(policy.named_parameters()))
    k = max(1, steps // 4)
    return {"task": task, "optimizer": optimizer, "lr": lr, "steps": steps,
            "reward_first": sum(rewards[:k]) / k, "reward_last": sum(rewards[-k:]) / k,
            **{key: v for key, v in stats.items() if key != "agent"}}


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: run every setting and write `precision_study.csv`."""
    parser = argparse.ArgumentParser(prog="python -m assets.demo.precision_study")
    parser.add_argument("--base", type=Path, default=DEMO_DIR / "models" / "base")
    parser.add_argument("--task", default="code")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path, default=DEMO_DIR / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    rows = []
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

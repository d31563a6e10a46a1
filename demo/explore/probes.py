"""Probes of the mechanism: which parameters an agent can move at all (gradients at the base), and whether an
architecture learns the memory task's retrieval in a short clean warm-up."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import torch

from merging.methods.regions import chance_unique_share

from ..evaluate import evaluate_loaded
from ..modeling import build_tokenizer, load_checkpoint, new_model
from ..tasks import TASKS
from ..train import RLConfig, WarmupConfig, deterministic_torch, rl_train, warmup
from .configs import PROBE_ARCHS, RESULTS, get_suite, results_dir
from .runs import ensure_base
from .tables import upsert


def reachable(work: Path, name: str, steps: int = 20) -> pd.DataFrame:
    """Which parameters can an Adam agent move at all? For each task, run `steps` GRPO batches at
    the base with a zero learning rate (the weights never change) and record every element that
    receives a non-zero gradient in any batch. Adam never moves an element whose gradient is
    exactly zero (its moments stay 0), so this set bounds the task's density; how much of it
    is reachable by one task only is the structural part of the overlap."""
    deterministic_torch()
    folder = ensure_base(work, name)
    masks: dict[str, dict[str, torch.Tensor]] = {}
    for task in TASKS:
        policy, tok = load_checkpoint(folder)
        mask = {n: torch.zeros_like(p, dtype=torch.bool) for n, p in policy.named_parameters()}

        def record(model: torch.nn.Module, mask: dict = mask) -> None:
            for n, p in model.named_parameters():
                if p.grad is not None:
                    mask[n] |= p.grad != 0

        rl_train(policy, tok, task, RLConfig(steps=steps, lr=0.0, optimizer="sgd"), task,
                 lambda rec: None, on_grad=record)
        masks[task] = mask
    from analysis.names import module_of
    rows = []
    names = list(masks[TASKS[0]])
    for task in TASKS:
        others = [t for t in TASKS if t != task]
        groups: dict[str, list[int]] = {}
        for n in names:
            mine = masks[task][n]
            alone = mine & ~torch.stack([masks[t][n] for t in others]).any(0)
            for key in ("all", module_of(n)):
                g = groups.setdefault(key, [0, 0, 0])
                g[0] += mine.numel()
                g[1] += int(mine.sum())
                g[2] += int(alone.sum())
        for key, (numel, reach, alone) in groups.items():
            rows.append({"base": name, "task": task, "module": key, "numel": numel,
                         "reachable": reach / numel, "reachable_only_by_this_task":
                         alone / reach if reach else 0.0, "steps": steps})
    df = pd.DataFrame(rows)
    total = df[df.module == "all"].set_index("task")["reachable"]
    chance = chance_unique_share([float(total[t]) for t in TASKS])
    df["chance_only_by_this_task"] = [chance[TASKS.index(t)] if m == "all" else float("nan")
                                      for t, m in zip(df.task, df.module)]
    upsert(RESULTS / "mechanisms_reachable.csv", df, ["base", "task", "module"])
    print(df[df.module == "all"].to_string(index=False), flush=True)
    return df


def probe(name: str, steps: int = 1400, lr: float = 2e-3, every: int = 200,
          suite_name: str = "demo") -> pd.DataFrame:
    """Does an architecture learn the memory task's retrieval in a short clean warm-up? Warm up
    on correct demonstrations only (cosine schedule over `steps`) and score memory and code on 60
    validation prompts every `every` steps. Writes rows to the suite's `mechanisms_probes.csv`
    (the original suite's rows keep their schema; other suites add a `suite` column)."""
    deterministic_torch()
    kind, arch = PROBE_ARCHS[name]
    suite = get_suite(suite_name)
    tok = build_tokenizer(kind, suite=suite)
    model = new_model(tok, 0, **arch)
    rows: list[dict] = []
    t0 = time.time()

    def log(rec: dict) -> None:
        if rec["step"] % every == 0:
            model.eval()
            acc = evaluate_loaded(model, tok, ("memory", "code"), "validation", limit=60, suite=suite)
            acc = acc[acc.subset == "all"].set_index("task")["accuracy"]
            rows.append({"probe": name, **({} if suite_name == "demo" else {"suite": suite_name}),
                         "tokenizer": kind, "arch": json.dumps(arch),
                         "lr": lr, "steps": steps, "step": rec["step"],
                         "val_memory": round(100 * acc["memory"], 2),
                         "val_code": round(100 * acc["code"], 2),
                         "elapsed_s": round(time.time() - t0, 1)})
            print(f"[probe] {rows[-1]}", flush=True)
            model.train()

    warmup(model, tok, WarmupConfig(steps=steps, lr=lr, clean_fraction=1.0), log, suite)
    df = pd.DataFrame(rows)
    keys = ["probe", "lr", "steps", "step"] + ([] if suite_name == "demo" else ["suite"])
    upsert(results_dir(suite_name) / "mechanisms_probes.csv", df, keys)
    return df

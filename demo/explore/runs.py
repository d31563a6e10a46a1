"""Training and scoring what the exploration tries: a base warmed up once, an agent per (base, agent, recipe),
and a trio analysed together with the library at ε = 1e-5; every result lands in the CSV tables."""
from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pandas as pd
import torch

from ..evaluate import evaluate_loaded
from ..modeling import build_tokenizer, load_checkpoint, new_model, save_checkpoint
from ..suites import SUITES
from ..task_vectors import by_module, run_analysis, summary
from ..tasks import TASKS
from ..train import deterministic_torch, rl_train, warmup
from .agreement import pair_agreement
from .configs import BASES, Trio, get_suite, recipe_config
from .tables import upsert


def base_dir(work: Path, name: str) -> Path:
    return work / "bases" / name / "base"


def ensure_base(work: Path, name: str) -> Path:
    """Warm up base `name` into the scratch folder unless it is already there; record its
    validation accuracy and warm-up time in `mechanisms_bases.csv`."""
    spec = BASES[name]
    folder = base_dir(work, name)
    if (folder / "model.safetensors").is_file():
        return folder
    deterministic_torch()
    t0 = time.time()
    suite = get_suite(spec.suite)
    tok = build_tokenizer(spec.tokenizer, spec.vocab_size, spec.seed, spec.tokenizer_corpus, suite)
    model = new_model(tok, spec.seed, suite=spec.suite if spec.suite in SUITES else None, **spec.model)
    log_path = folder.parent / "warmup_log.csv"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, ["step", "task", "loss", "lr", "elapsed_s"], extrasaction="ignore")
        writer.writeheader()

        def log(rec: dict) -> None:
            writer.writerow(rec)
            fh.flush()
            if rec["step"] % 250 == 0:
                print(f"  [{name}] warm-up step {rec['step']} loss {rec['loss']}", flush=True)

        warmup(model, tok, spec.warmup, log, suite)
    save_checkpoint(model, tok, folder)
    seconds = time.time() - t0
    m, tok = load_checkpoint(folder)
    acc = evaluate_loaded(m, tok, TASKS, "validation", suite=suite)
    row = {"base": name, "description": spec.description,
           "params": sum(p.numel() for p in m.parameters()), "vocab": len(tok),
           "warmup_s": round(seconds, 1),
           **{f"val_{r.task}": round(100 * r.accuracy, 2) for r in acc.itertuples() if r.subset == "all"},
           **_slips(acc)}
    upsert(spec.results / "mechanisms_bases.csv", pd.DataFrame([row]), ["base"])
    print(f"[explore] base {name}: {row}", flush=True)
    return folder


def run_agent(work: Path, base: str, agent: str, recipe: str) -> tuple[Path, dict]:
    """Train (or reuse) one agent: GRPO from the stored base with a named recipe, stored in bf16,
    scored greedily on the validation split of its own task. Returns its folder and record."""
    folder = work / "runs" / base / agent / recipe
    record_path = folder.parent / f"{recipe}.json"
    if record_path.is_file() and (folder / "model.safetensors").is_file():
        return folder, json.loads(record_path.read_text())
    deterministic_torch()
    base_path = ensure_base(work, base)
    cfg = recipe_config(recipe)
    t0 = time.time()
    policy, tok = load_checkpoint(base_path)
    log: list[dict] = []
    suite = get_suite(BASES[base].suite)
    rl_train(policy, tok, agent, cfg, agent, log.append, suite=suite)
    save_checkpoint(policy, tok, folder)
    seconds = round(time.time() - t0, 1)
    m, tok = load_checkpoint(folder)
    val = _accuracy(m, tok, BASES[base].suite)
    base_val = base_accuracy(work, base)
    rewards = [r["mean_reward"] for r in log]
    k = max(1, len(rewards) // 5)
    record = {"base": base, "agent": agent, "recipe": recipe, "optimizer": cfg.optimizer,
              "lr": cfg.lr, "steps": cfg.steps, "adam_eps": cfg.adam_eps,
              "val_base": base_val[agent], "val_agent": val[agent],
              "val_gain": round(val[agent] - base_val[agent], 2),
              **{f"val_{t}": val[t] for t in TASKS},
              **{f"val_{k}": v for k, v in val.items() if k.startswith("slip_")},
              "reward_first": round(sum(rewards[:k]) / k, 4),
              "reward_last": round(sum(rewards[-k:]) / k, 4), "rl_s": seconds}
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    pd.DataFrame(log).to_csv(folder.parent / f"{recipe}_log.csv", index=False)
    print(f"[explore] {base} {agent} {recipe}: {record}", flush=True)
    return folder, record


def base_accuracy(work: Path, base: str) -> dict[str, float]:
    """Validation accuracy (%) of a base on each task (cached next to it)."""
    path = base_dir(work, base).parent / "val_accuracy.json"
    if path.is_file():
        return json.loads(path.read_text())
    m, tok = load_checkpoint(ensure_base(work, base))
    acc = _accuracy(m, tok, BASES[base].suite)
    path.write_text(json.dumps(acc) + "\n")
    return acc


def run_trio(work: Path, trio: Trio) -> pd.DataFrame:
    """Train (or reuse) the three agents of a trio and analyse them together at ε = 1e-5."""
    runs = {a: run_agent(work, trio.base, a, trio.recipes[a]) for a in TASKS}
    result = run_analysis(base_dir(work, trio.base), {a: runs[a][0] for a in TASKS}, (1e-5,))
    stats = summary(result).set_index("agent")
    rows = []
    for agent in TASKS:
        rec = runs[agent][1]
        st = stats.loc[agent]
        rows.append({"trio": trio.id, "base": trio.base, "mechanism": trio.mechanism,
                     "agent": agent, "recipe": rec["recipe"], "optimizer": rec["optimizer"],
                     "lr": rec["lr"], "steps": rec["steps"], "params": int(st["params"]),
                     "density": st["density"], "unique_share": st["unique_share"],
                     "chance_unique_share": st["chance_unique_share"], "rho": st["rho"],
                     "chance_rho": st["chance_rho"], "val_base": rec["val_base"],
                     "val_agent": rec["val_agent"], "val_gain": rec["val_gain"],
                     "reward_first": rec["reward_first"], "reward_last": rec["reward_last"],
                     "rl_s": rec["rl_s"]})
    table = pd.DataFrame(rows)
    results = BASES[trio.base].results
    upsert(results / "mechanisms.csv", table, ["trio", "agent"])
    mod = by_module(result)
    mod.insert(0, "trio", trio.id)
    upsert(results / "mechanisms_modules.csv", mod, ["trio", "agent", "module"])
    pairs = pair_agreement(base_dir(work, trio.base), {a: runs[a][0] for a in TASKS})
    pairs.insert(0, "trio", trio.id)
    upsert(results / "mechanisms_pairs.csv", pairs, ["trio", "a", "b"])
    print(table[["trio", "agent", "recipe", "density", "unique_share", "chance_unique_share",
                 "rho", "val_gain"]].to_string(index=False), flush=True)
    print(pairs.to_string(index=False), flush=True)
    return table


def _accuracy(model: torch.nn.Module, tok: object, suite: str = "demo") -> dict[str, float]:
    """Greedy validation accuracy (%) on each task (and, with an answer envelope, the count of
    outputs wrong only for the missing envelope, `slip_TASK`)."""
    acc = evaluate_loaded(model, tok, TASKS, "validation", suite=get_suite(suite))
    return {**{r.task: round(100 * r.accuracy, 2) for r in acc.itertuples() if r.subset == "all"},
            **_slips(acc)}


def _slips(acc: pd.DataFrame) -> dict[str, int]:
    """Per task, how many outputs were wrong only for the missing envelope (empty without one)."""
    if "format_slip" not in acc:
        return {}
    return {f"slip_{r.task}": int(r.format_slip) for r in acc.itertuples() if r.subset == "all"}

"""Rebuild the bundled demo from seeds on a CPU: warm-up base, RL agents, evaluation, analysis.

    python -m demo.build                 # full build into assets/demo/{models,results}
    python -m demo.build --quick --out D # CI smoke build (tiny sizes) into D
    python -m demo.build --suite shared  # the shared-skill trio: assets/demo/{models,results}-shared

Everything is written into a temporary folder next to the destination and renamed into place
at the end, so an interrupted build never leaves half-written models behind.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch
import transformers

from . import DATA_DIR
from .evaluate import evaluate_loaded, format_table, summary_table
from .modeling import build_tokenizer, load_checkpoint, new_model, save_checkpoint, write_json
from .suites import SUITE_CONFIG_KEY, SUITES, TaskSuite, get_suite
from .task_vectors import by_module, ladder_summary, run_analysis, summary
from .tasks import TASKS
from .train import WORD_HABITS, RLConfig, WarmupConfig, deterministic_torch, rl_train, warmup

DEMO_DIR = DATA_DIR  # where the full build writes: assets/demo/{models,results}
AGENTS: tuple[str, ...] = TASKS  # agent name == the task it is trained on


@dataclass(frozen=True)
class BuildConfig:
    """All knobs of one build. `tokenizer` is "char" or "bpe" (with `vocab_size`); `model` holds
    the keyword arguments of `modeling.model_config`; `rl` is the default RL recipe and `agent_rl`
    per-agent overrides of any RLConfig field (optimizer, lr, steps, ...)."""

    seed: int = 0
    tokenizer: str = "char"
    vocab_size: int = 300
    model: dict = field(default_factory=lambda: {"hidden": 96, "layers": 3, "heads": 4,
                                                 "intermediate": 256})
    warmup: WarmupConfig = WarmupConfig()
    rl: RLConfig = RLConfig()
    agent_rl: dict = field(default_factory=lambda: {"code": {"steps": 100}, "tool": {"steps": 50},
                                                    "memory": {"steps": 100}})
    eval_limit: int | None = None
    suite: str = "demo"  # the task suite (suites.SUITES): "demo" or "shared"

    @property
    def folders(self) -> tuple[str, str]:
        """Names of the models and results folders of this suite's trio."""
        return ("models", "results") if self.suite == "demo" else (f"models-{self.suite}",
                                                                    f"results-{self.suite}")

    def recipe(self, agent: str) -> RLConfig:
        """The RL configuration of one agent (defaults plus its overrides)."""
        return replace(self.rl, **self.agent_rl.get(agent, {}))


# The shipped trio ("labs-a" in results/mechanisms.csv): word tokens, the v1 architecture, and one
# RL recipe per agent, as if the agents came from different labs. Plain SGD moves a weight in
# proportion to its gradient, so small steps leave most bf16 weights untouched (Adam would move
# every weight with a non-zero gradient by about lr); each recipe was chosen on validation only.
FULL = BuildConfig(tokenizer="bpe",
                   warmup=WarmupConfig(habit_rates=WORD_HABITS),
                   agent_rl={"code": {"optimizer": "sgd", "lr": 1e-2, "steps": 100},
                             "tool": {"optimizer": "sgd", "lr": 1e-3, "steps": 300},
                             "memory": {"optimizer": "sgd", "lr": 1e-2, "steps": 300}})
# CI smoke build: the same pipeline at toy size. The warm-up is long enough, and the RL groups
# large enough, that every agent sees rewards that differ within a group and so takes real
# policy-gradient steps (checked by tests/demo/test_build.py).
QUICK = BuildConfig(tokenizer="bpe",
                    model={"hidden": 32, "layers": 2, "heads": 2, "intermediate": 128,
                           "act": "relu", "tie": False},
                    warmup=WarmupConfig(steps=400, batch_size=16, lr=3e-3),
                    rl=RLConfig(steps=3, prompts=8, group=8, lr=1e-3), agent_rl={}, eval_limit=6)

# The shared-skill trio (models-shared/, results-shared/): the same tasks, every answer also ends with
# one closing tag </a> that each verifier requires; the mixed-quality end of the warm-up also writes a
# share of the demonstrations without it (one careless protocol habit common to all tasks), so every
# agent's RL must fix the tag as well as its own task's habit. Recipes chosen on validation in the
# exploration (results-shared/mechanisms.csv, trio close-g); the base is explore's close-silu.
SHARED_FULL = replace(FULL, suite="shared",
                      warmup=replace(FULL.warmup, format_slip_rate=0.5),
                      agent_rl={"code": {"optimizer": "sgd", "lr": 1e-2, "steps": 100},
                                "tool": {"optimizer": "sgd", "lr": 3e-3, "steps": 300},
                                "memory": {"optimizer": "sgd", "lr": 1e-2, "steps": 300}})
SHARED_QUICK = replace(QUICK, suite="shared", warmup=replace(QUICK.warmup, format_slip_rate=0.5))
CONFIGS: dict[tuple[str, bool], BuildConfig] = {("demo", False): FULL, ("demo", True): QUICK,
                                                ("shared", False): SHARED_FULL,
                                                ("shared", True): SHARED_QUICK}


class CsvLog:
    """Append-only CSV training log (reward curves the app can plot) that also echoes progress."""

    COLUMNS = ["stage", "agent", "task", "step", "mean_reward", "sample_accuracy",
               "frac_groups_with_signal", "loss", "lr", "elapsed_s"]

    def __init__(self, path: Path, echo: bool = True) -> None:
        self.path, self.echo = path, echo
        with path.open("w", newline="") as fh:
            csv.writer(fh).writerow(self.COLUMNS)

    def __call__(self, record: dict) -> None:
        with self.path.open("a", newline="") as fh:
            csv.writer(fh).writerow([record.get(c, "") for c in self.COLUMNS])
        if self.echo and (record.get("stage") == "rl" or record["step"] % 100 == 0):
            print("  " + " ".join(f"{k}={v}" for k, v in record.items()), flush=True)


def build(out: Path, cfg: BuildConfig, reuse_base: Path | None = None) -> dict:
    """Run every stage into a temp folder, then move the suite's models and results folders
    (`models/`, `results/`; `models-shared/`, `results-shared/`) into `out`.

    `reuse_base` skips the warm-up and copies an existing base (e.g. the committed one, which the
    deterministic warm-up reproduces) so only the RL stages and the analysis are re-run."""
    deterministic_torch()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build.partial-", dir=out))
    try:
        info = _build_into(work, cfg, reuse_base)
        for name in cfg.folders:
            _swap_in(work / name, out / name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return info


# Files of a results folder that another script writes from its own runs (the exploration's tables):
# a rebuild keeps them.
KEPT_RESULTS = ("mechanisms*.csv",)


def _swap_in(src: Path, dst: Path) -> None:
    """Replace `dst` by `src` with renames (old copy removed only after the new one is in place);
    files of `dst` matching KEPT_RESULTS that `src` lacks are carried over first."""
    old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
    if dst.exists():
        for pattern in KEPT_RESULTS:
            for kept in dst.glob(pattern):
                if kept.is_file() and not kept.is_symlink() and not (src / kept.name).exists():
                    shutil.copy2(kept, src / kept.name)
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)


def _build_into(work: Path, cfg: BuildConfig, reuse_base: Path | None = None) -> dict:
    """The actual pipeline; returns build metadata (timings, versions, config)."""
    suite = get_suite(cfg.suite)
    models, results = (work / name for name in cfg.folders)
    models.mkdir()
    results.mkdir()
    log = CsvLog(results / "training_log.csv")
    timings: dict[str, float] = {}
    t_start = time.time()
    if reuse_base is None:
        _warm_up_base(models / "base", cfg, suite, log, timings)
    else:
        _reuse_base(reuse_base, models / "base", cfg, log)
    update_stats = _train_agents(models, cfg, suite, log, timings)
    _evaluate_models(models, results, cfg, suite, timings)
    pd.DataFrame(update_stats).to_csv(results / "rl_update_precision.csv", index=False)
    _analyse_task_vectors(models, results)
    timings["total_s"] = round(time.time() - t_start, 1)
    info = {"timings": timings, "config": _jsonable(asdict(cfg)), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpu_count": os.cpu_count(), "torch_threads": 1}
    write_json(results / "build_info.json", info)
    print(f"[build] done in {timings['total_s']} s: {timings}", flush=True)
    return info


def _warm_up_base(folder: Path, cfg: BuildConfig, suite: TaskSuite, log: CsvLog, timings: dict[str, float]) -> None:
    """A fresh tokenizer and model, warmed up on the suite's demonstrations and stored in `folder`."""
    t0 = time.time()
    print(f"[build] warm-up of the base ({cfg.warmup.steps} steps)", flush=True)
    tokenizer = build_tokenizer(cfg.tokenizer, cfg.vocab_size, cfg.seed, suite=cfg.suite)
    model = new_model(tokenizer, cfg.seed, suite=cfg.suite, **cfg.model)
    warmup(model, tokenizer, cfg.warmup, log, suite)
    save_checkpoint(model, tokenizer, folder)
    timings["warmup_s"] = round(time.time() - t0, 1)


def _reuse_base(reuse_base: Path, folder: Path, cfg: BuildConfig, log: CsvLog) -> None:
    """Copy an existing base into `folder` and replay the warm-up rows of the run that produced it into the log."""
    print(f"[build] reusing the base from {reuse_base}", flush=True)
    shutil.copytree(reuse_base, folder)
    _record_suite(folder, cfg.suite)
    old_log = reuse_base.parent.parent / cfg.folders[1] / "training_log.csv"
    explore_log = reuse_base.parent / "warmup_log.csv"  # a base warmed up by demo.explore
    if old_log.is_file():  # keep the warm-up rows of the run that produced this base
        old = pd.read_csv(old_log, dtype=str, keep_default_na=False)
        for rec in old[old.stage == "warmup"].to_dict("records"):
            log({**rec, "step": int(rec["step"])})
    elif explore_log.is_file():
        old = pd.read_csv(explore_log, dtype=str, keep_default_na=False)
        for rec in old.to_dict("records"):
            log({**rec, "stage": "warmup", "step": int(rec["step"])})


def _train_agents(models: Path, cfg: BuildConfig, suite: TaskSuite, log: CsvLog,
                  timings: dict[str, float]) -> list[dict]:
    """GRPO for each agent from the stored base; returns how much of each fp32 update survives bf16."""
    update_stats: list[dict] = []
    for agent in AGENTS:
        rl_cfg = cfg.recipe(agent)
        print(f"[build] RL agent {agent!r} ({rl_cfg.steps} GRPO steps, {rl_cfg.optimizer} "
              f"lr {rl_cfg.lr:g})", flush=True)
        t0 = time.time()
        # Start from the *stored* bf16 base so untouched weights round back bit-exactly.
        policy, tok = load_checkpoint(models / "base")
        start = {k: v.detach().clone() for k, v in policy.named_parameters()}
        rl_train(policy, tok, agent, rl_cfg, agent, log, suite=suite)
        update_stats.append(bf16_update_stats(agent, start, dict(policy.named_parameters())))
        save_checkpoint(policy, tok, models / agent)
        timings[f"rl_{agent}_s"] = round(time.time() - t0, 1)
    return update_stats


def _evaluate_models(models: Path, results: Path, cfg: BuildConfig, suite: TaskSuite,
                     timings: dict[str, float]) -> None:
    """Greedy accuracy of the base and every agent on both splits: accuracy.csv and the test table."""
    print("[build] evaluation (greedy, test and validation splits)", flush=True)
    t0 = time.time()
    frames = []
    for name in ("base",) + AGENTS:
        m, tok = load_checkpoint(models / name)
        for split in ("validation", "test"):
            df = evaluate_loaded(m, tok, TASKS, split, cfg.eval_limit, suite)
            frames.append(df.assign(model=name, split=split))
    acc = pd.concat(frames, ignore_index=True)
    acc = acc[["model", "split", "task", "subset", "n", "correct", "habit"] +
              (["format_slip"] if suite.enveloped else []) + ["accuracy"]]
    acc.to_csv(results / "accuracy.csv", index=False)
    test = {name: acc[(acc.model == name) & (acc.split == "test")] for name in ("base",) + AGENTS}
    table = summary_table(test)
    (results / "accuracy.md").write_text(format_table(table) + "\n")
    print(format_table(table), flush=True)
    timings["evaluation_s"] = round(time.time() - t0, 1)


def _analyse_task_vectors(models: Path, results: Path) -> None:
    """The library's analysis of the trio: task-vector tables at ε = 1e-5, per ε and per module."""
    analysis = run_analysis(models / "base", [models / a for a in AGENTS])  # the library's pass
    tv = summary(analysis, 1e-5)
    tv.to_csv(results / "task_vectors.csv", index=False)
    ladder_summary(analysis).to_csv(results / "task_vectors_eps_ladder.csv", index=False)
    by_module(analysis, 1e-5).to_csv(results / "task_vectors_by_module.csv", index=False)
    print(tv[["agent", "density", "unique_share", "chance_unique_share", "rho"]].to_string(
        index=False), flush=True)


def _record_suite(base: Path, suite: str) -> None:
    """Name the build's task suite in a reused base's config.json, as `modeling.new_model` does for a base it
    warms up (an exploration base may predate the key); every agent copies it from the base. A base that names
    another suite is refused."""
    path = base / "config.json"
    config = json.loads(path.read_text())
    named = config.get(SUITE_CONFIG_KEY, "demo")
    if named == suite:
        return
    if named != "demo" or suite == "demo":
        raise ValueError(f"{base} was warmed up on the {named!r} suite, not {suite!r}")
    config[SUITE_CONFIG_KEY] = suite
    write_json(path, config)


def bf16_update_stats(agent: str, start: dict[str, torch.Tensor], end: dict[str, torch.Tensor]) -> dict:
    """How much of the fp32 RL update survives bf16 storage (density before/after rounding)."""
    total = changed_fp32 = changed_any = survived = 0
    for name, before in start.items():
        after = end[name].detach().float()
        diff = (after - before).abs()
        stored = (after.to(torch.bfloat16).float() - before).abs()
        total += diff.numel()
        changed_any += int((diff > 0).sum())
        changed_fp32 += int((diff > 1e-5).sum())
        survived += int((stored > 1e-5).sum())
    return {"agent": agent, "params": total, "fp32_changed_any": changed_any / total,
            "fp32_density_eps1e-5": changed_fp32 / total, "bf16_density_eps1e-5": survived / total}


def _jsonable(obj: object) -> object:
    """Tuples to lists recursively so the config can be stored as JSON."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: full build into the committed folder, or a quick smoke build into --out."""
    parser = argparse.ArgumentParser(prog="python -m demo.build",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and a handful of steps")
    parser.add_argument("--reuse-base", type=Path, default=None,
                        help="skip the warm-up and start RL from this base folder")
    parser.add_argument("--out", type=Path, default=None,
                        help="destination folder (required with --quick; default assets/demo)")
    parser.add_argument("--suite", default="demo", choices=sorted(SUITES),
                        help="task suite: demo (models/, results/) or shared (the shared-skill "
                             "trio: models-shared/, results-shared/)")
    args = parser.parse_args(argv)
    if args.quick and args.out is None:
        parser.error("--quick needs --out DIR (it never overwrites the committed models)")
    out = (args.out or DEMO_DIR).resolve()
    if args.quick and out == DEMO_DIR:
        parser.error("--quick must not write into the committed demo folder")
    reuse = args.reuse_base.resolve() if args.reuse_base else None
    cfg = CONFIGS[(args.suite, args.quick)]
    info = build(out, cfg, reuse)
    models, results = cfg.folders
    print(f"[build] models in {out / models}, results in {out / results}; "
          f"run time {info['timings']['total_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Committed demo checkpoints: Hub-style bf16 Qwen2 folders; each agent beats the base on its task."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

DEMO = Path(__file__).resolve().parents[1] / "assets" / "demo"
NAMES = ("base", "code", "tool", "memory")
MIN_GAIN = 0.10  # absolute test-accuracy margin (measured: code +15.3, tool +18.3, memory +53.3 points)


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_is_bf16_qwen2(name: str) -> None:
    folder = DEMO / "models" / name
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    with safe_open(str(folder / "model.safetensors"), "pt") as fh:
        assert {fh.get_slice(k).get_dtype() for k in fh.keys()} == {"BF16"}
    assert (folder / "model.safetensors").stat().st_size < 8 * 2**20
    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert tok.decode(tok("M:q7vK=42x9b?K>")["input_ids"]) == "M:q7vK=42x9b?K>"


def test_agents_beat_base_on_own_task() -> None:
    acc = pd.read_csv(DEMO / "results" / "accuracy.csv")
    test = acc[(acc.split == "test") & (acc.subset == "all")].set_index(["model", "task"])["accuracy"]
    for agent in ("code", "tool", "memory"):
        assert test[(agent, agent)] >= test[("base", agent)] + MIN_GAIN, agent


def test_base_is_partially_competent() -> None:
    """The warm-up leaves room for RL: the base is neither helpless nor near perfect on any task."""
    acc = pd.read_csv(DEMO / "results" / "accuracy.csv")
    base = acc[(acc.model == "base") & (acc.split == "test") & (acc.subset == "all")]
    assert set(base.task) == {"code", "tool", "memory"}
    assert base.accuracy.between(0.15, 0.8).all(), base


def test_training_log_has_reward_curves() -> None:
    log = pd.read_csv(DEMO / "results" / "training_log.csv")
    rl = log[log.stage == "rl"]
    assert set(rl.agent) == {"code", "tool", "memory"}
    for agent, grp in rl.groupby("agent"):
        assert grp.step.is_monotonic_increasing and grp.mean_reward.between(0, 1).all()


def test_demo_passes_merging_inspect() -> None:
    """The committed checkpoints pass the core CLI's header-only compatibility report."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "merging", "inspect", "demo:base", "demo:code", "demo:tool",
                           "demo:memory"], cwd=DEMO.parents[1], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compatible: same architecture, tensor names, shapes and dtypes." in proc.stdout
    assert proc.stdout.count("Qwen2ForCausalLM") == 4 and "BF16 (314,592)" in proc.stdout

"""Committed demo checkpoints: Hub-style bf16 Qwen2 folders; each agent beats the base on its task;
the task vectors (recomputed from the checkpoints with the library) meet the demo's targets."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.paths import REPO_ROOT

DEMO = REPO_ROOT / "assets" / "demo"
NAMES = ("base", "code", "tool", "memory")
AGENTS = ("code", "tool", "memory")
MIN_GAIN = 0.10  # absolute test-accuracy margin of each agent over the base on its own task


@pytest.fixture(scope="module")
def stats() -> pd.DataFrame:
    """Task-vector statistics at ε = 1e-5 recomputed from the committed checkpoints."""
    from demo.task_vectors import run_analysis, summary
    models = DEMO / "models"
    return summary(run_analysis(models / "base", {a: models / a for a in AGENTS}, (1e-5,)),
                   1e-5).set_index("agent")


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_is_bf16_qwen2(name: str) -> None:
    folder = DEMO / "models" / name
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    with safe_open(str(folder / "model.safetensors"), "pt") as fh:
        assert {fh.get_slice(k).get_dtype() for k in fh.keys()} == {"BF16"}
    assert (folder / "model.safetensors").stat().st_size < 8 * 2**20
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False)
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert tok.decode(tok("M:q7vK=42x9b?K>")["input_ids"]) == "M:q7vK=42x9b?K>"
    assert len(tok("T:weather in oslo>")["input_ids"]) == 6  # T : weather Ġin Ġoslo >


def test_agents_beat_base_on_own_task() -> None:
    acc = pd.read_csv(DEMO / "results" / "accuracy.csv")
    test = acc[(acc.split == "test") & (acc.subset == "all")].set_index(["model", "task"])["accuracy"]
    for agent in AGENTS:
        assert test[(agent, agent)] >= test[("base", agent)] + MIN_GAIN, agent


def test_base_is_partially_competent() -> None:
    """The warm-up leaves room for RL: the base is not near perfect on any task and gets some of each right
    (memory retrieval is the weakest: 8.7 % on test, 16 % on validation, for the shipped base)."""
    acc = pd.read_csv(DEMO / "results" / "accuracy.csv")
    base = acc[(acc.model == "base") & (acc.split == "test") & (acc.subset == "all")]
    assert set(base.task) == set(AGENTS)
    assert base.accuracy.between(0.05, 0.8).all(), base


def test_committed_task_vector_table_matches_checkpoints(stats: pd.DataFrame) -> None:
    table = pd.read_csv(DEMO / "results" / "task_vectors.csv").set_index("agent")
    for agent in AGENTS:
        for col in ("changed", "shared", "unique"):
            assert table.loc[agent, col] == stats.loc[agent, col], (agent, col)
        assert table.loc[agent, "chance_unique_share"] == pytest.approx(
            stats.loc[agent, "chance_unique_share"], rel=1e-12)


def test_density_spread_like_the_paper(stats: pd.DataFrame) -> None:
    """At least one agent ≤ 25 % dense and one ≥ 40 % (paper: 3.2 / 46.2 / 54.3 %)."""
    assert stats["density"].min() <= 0.25, stats["density"]
    assert stats["density"].max() >= 0.40, stats["density"]


def test_unique_shares(stats: pd.DataFrame) -> None:
    """Unique share of changed ≥ 20 % for at least one agent (paper: 6.3 / 40.8 / 47.5 %). The issue's
    target of two agents was not reached by the shipped trio: with these tasks the agents' changed sets
    overlap more than chance, and the trios that reach it (labs-c, labs-d in results/mechanisms.csv)
    lose ρ_t ≤ 2 instead; the shipped trio keeps ρ_t ≤ 2 (the test below)."""
    assert (stats["unique_share"] >= 0.20).sum() >= 1, stats["unique_share"]
    assert (stats["unique_share"] < stats["chance_unique_share"]).all(), stats  # overlap above chance


def test_rho_inside_the_clip_range(stats: pd.DataFrame) -> None:
    """At least one agent has ρ_t ≤ α = 2, so RAM+'s λ_t is not saturated for every agent."""
    assert (stats["rho"] <= 2.0).any(), stats["rho"]


def test_chance_yardstick(stats: pd.DataFrame) -> None:
    """The chance column is Π_{j≠i}(1 − d_j) of the measured densities."""
    d = stats["density"]
    for agent in AGENTS:
        expected = 1.0
        for other in AGENTS:
            if other != agent:
                expected *= 1.0 - d[other]
        assert stats.loc[agent, "chance_unique_share"] == pytest.approx(expected, rel=1e-12)


def test_training_log_has_reward_curves() -> None:
    log = pd.read_csv(DEMO / "results" / "training_log.csv")
    rl = log[log.stage == "rl"]
    assert set(rl.agent) == set(AGENTS)
    for _agent, grp in rl.groupby("agent"):
        assert grp.step.is_monotonic_increasing and grp.mean_reward.between(0, 1).all()


def test_fig3_results_schema() -> None:
    fig3 = pd.read_csv(DEMO / "results" / "fig3.csv")
    assert list(fig3.columns) == ["agent", "variant", "task", "subset", "split", "n", "correct",
                                  "accuracy"]
    assert set(fig3.agent.dropna()) == set(AGENTS)
    assert set(fig3.variant) == {"base", "unique", "unique_div_N", "agent"}
    assert set(fig3.split) == {"validation", "test"}
    assert fig3.accuracy.between(0, 1).all()


def test_demo_passes_merging_inspect() -> None:
    """The committed checkpoints pass the core CLI's header-only compatibility report."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "merging", "inspect", "demo:base", "demo:code", "demo:tool",
                           "demo:memory"], cwd=DEMO.parents[1], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compatible: same architecture, tensor names, shapes and dtypes." in proc.stdout
    model = AutoModelForCausalLM.from_pretrained(DEMO / "models" / "base", trust_remote_code=False)
    params = sum(p.numel() for p in model.parameters())
    assert proc.stdout.count("Qwen2ForCausalLM") == 4 and f"BF16 ({params:,})" in proc.stdout

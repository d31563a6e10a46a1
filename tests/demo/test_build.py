"""Demo build: the --quick build runs end to end on CPU, loads with transformers, evaluates
deterministically, and refuses to overwrite the committed models."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from demo.evaluate import evaluate_model
from demo.evaluate import main as evaluate_main
from tests.paths import REPO_ROOT

REPO = REPO_ROOT


@pytest.fixture(scope="module")
def quick_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    out = tmp_path_factory.mktemp("demo-quick")
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "demo.build", "--quick", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, time.time() - t0


def test_quick_build_is_complete(quick_build: tuple[Path, float]) -> None:
    """Every model and results file is there (its wall time is recorded in build_info.json, never asserted)."""
    out, _ = quick_build
    for name in ("base", "code", "tool", "memory"):
        folder = out / "models" / name
        for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json"):
            assert (folder / f).is_file(), folder / f
    results = out / "results"
    for f in ("training_log.csv", "accuracy.csv", "task_vectors.csv", "task_vectors_eps_ladder.csv",
              "task_vectors_by_module.csv", "rl_update_precision.csv", "build_info.json"):
        assert (results / f).is_file(), f
    log = (results / "training_log.csv").read_text().splitlines()
    assert log[0].startswith("stage,agent,task,step,mean_reward")
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "temp folders left behind"
    assert json.loads((results / "build_info.json").read_text())["timings"]["total_s"] > 0


def test_quick_models_load_with_transformers(quick_build: tuple[Path, float]) -> None:
    out, _ = quick_build
    folder = out / "models" / "tool"
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False)
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert next(model.parameters()).dtype == torch.bfloat16
    text = "T:weather in oslo and call bob>"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    words = [tok.convert_ids_to_tokens(i) for i in ids]
    assert "weather" in words and "\u0120oslo" in words  # task words are single BPE tokens
    assert len(ids) < len(text)
    # transformers rebuilds Qwen2's pipeline on load; the raw tokenizers file must agree with it
    from tokenizers import Tokenizer
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for sample in (text, "C:x=6;b=x-7;print(b*2)>", "M:vogbuj390rpz9S=15s494nzp5a92ckz6?S>"):
        assert raw.encode(sample).ids == tok(sample)["input_ids"], sample
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape[-1] >= len(tok)
    config = model.config
    assert config.hidden_act == "relu" and config.tie_word_embeddings is False


def test_quick_build_takes_policy_gradient_steps(quick_build: tuple[Path, float]) -> None:
    """Every quick agent sees groups whose rewards differ, takes real GRPO steps, and so ends
    with weights that differ from the base."""
    import pandas as pd
    from safetensors.torch import load_file
    out, _ = quick_build
    log = pd.read_csv(out / "results" / "training_log.csv")
    rl = log[log.stage == "rl"]
    base = load_file(str(out / "models" / "base" / "model.safetensors"))
    for agent in ("code", "tool", "memory"):
        steps = rl[rl.agent == agent]
        assert (steps.frac_groups_with_signal > 0).any(), agent
        assert (steps.loss != 0).any(), agent
        tuned = load_file(str(out / "models" / agent / "model.safetensors"))
        changed = sum(int((tuned[k].float() != base[k].float()).sum()) for k in base)
        assert changed > 0, agent
    stats = pd.read_csv(out / "results" / "task_vectors.csv")
    assert (stats.density > 0).all()


def test_evaluation_is_deterministic(quick_build: tuple[Path, float], tmp_path: Path) -> None:
    out, _ = quick_build
    folder = out / "models" / "base"
    a = evaluate_model(folder, ("code", "memory"), "validation", limit=12)
    b = evaluate_model(folder, ("code", "memory"), "validation", limit=12)
    assert a.equals(b)
    assert list(a.columns) == ["task", "subset", "n", "correct", "habit", "accuracy"]
    assert (a.correct + a.habit <= a.n).all()  # habit answers are wrong answers
    assert set(a[a.task == "memory"].subset) == {"all", "32", "64", "128"}
    report = tmp_path / "r.json"
    assert evaluate_main([str(folder), "--tasks", "code", "--limit", "5", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["results"][0]["n"] == 5


def test_quick_refuses_committed_folder() -> None:
    from demo.build import DEMO_DIR, main
    with pytest.raises(SystemExit):
        main(["--quick"])
    with pytest.raises(SystemExit):
        main(["--quick", "--out", str(DEMO_DIR)])


def test_quick_build_is_deterministic(quick_build: tuple[Path, float], tmp_path: Path) -> None:
    out, _ = quick_build
    proc = subprocess.run([sys.executable, "-m", "demo.build", "--quick", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("base", "code", "tool", "memory"):
        a = (out / "models" / name / "model.safetensors").read_bytes()
        b = (tmp_path / "models" / name / "model.safetensors").read_bytes()
        assert a == b, name

"""`ram-studio evaluate`: the demo tasks and lm-eval from the command line, its JSON (placement rules of
`analyze --json`), clean stderr, and bad input as one line, exit 2, nothing written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import (
    run,  # in-process CLI run: a failure is one `error: …` line, no traceback
)
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
MODELS = ROOT / "assets" / "demo" / "models"
TASKS_DIR = ROOT / "assets" / "demo" / "lm_eval_tasks"


def test_demo_tasks_table_and_json(capsys, tmp_path: Path) -> None:
    report = tmp_path / "scores.json"
    code, out, _ = run(capsys, "evaluate", "demo:memory", "--tasks", "code,memory", "--split", "validation",
                       "--limit", "12", "--json", report, "--quiet")
    assert code == 0
    assert "accuracy %" in out and "habit" not in out and "average over 2 task(s)" in out
    doc = json.loads(report.read_text())
    assert doc["evaluator"] == "demo" and doc["suite"] == "demo" and doc["split"] == "validation"
    assert set(doc["scores"]) == {"code", "memory"} and doc["n"] == {"code": 12, "memory": 12}
    assert doc["average"] == pytest.approx(sum(doc["scores"].values()) / 2)
    assert {r["subset"] for r in doc["results"] if r["task"] == "memory"} == {"all", "32", "64", "128"}
    code, _, err = run(capsys, "evaluate", "demo:memory", "--limit", "1", "--json", report)
    assert code == 2 and "exists" in err and "--overwrite" in err  # never over a file without --overwrite


@pytest.mark.skipif(not __import__("importlib").util.find_spec("lm_eval"), reason="lm-eval not installed")
def test_lm_eval_from_the_command_line(capsys, tmp_path: Path) -> None:
    report = tmp_path / "lm.json"
    code, out, _ = run(capsys, "evaluate", "demo:tool", "--lm-eval", "ram_demo_tool,ram_demo_code",
                       "--include-path", TASKS_DIR, "--limit", "20", "--json", report, "--quiet")
    assert code == 0 and "ram_demo_tool" in out and "score %" in out
    doc = json.loads(report.read_text())
    assert doc["evaluator"] == "lm-eval" and set(doc["scores"]) == {"ram_demo_tool", "ram_demo_code"}
    code, out, _ = run(capsys, "evaluate", "demo:tool", "--tasks", "tool,code", "--limit", "20", "--quiet")
    assert f"{doc['scores']['ram_demo_tool']:.2f}" in out and f"{doc['scores']['ram_demo_code']:.2f}" in out


def test_loading_bars_stay_off_stderr(tmp_path: Path) -> None:
    """A real process: with --quiet stderr is empty; without it, only our own progress lines."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "ram_studio", "evaluate", "demo:base", "--limit", "4"]
    quiet = subprocess.run(cmd + ["--quiet"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    loud = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = loud.stderr.splitlines()
    assert loud.returncode == 0 and lines and all(line.startswith("evaluate: ") for line in lines), loud.stderr


def test_bad_input_is_one_line_and_writes_nothing(capsys, tmp_path: Path) -> None:
    report = tmp_path / "never.json"
    # a Qwen2.5-shaped model without the demo's tokenizer (once an IndexError traceback)
    qwen = tmp_path / "qwen"
    subprocess.run([sys.executable, "-m", "tests.benchmarks.make_checkpoints", "--shape", "tiny", "--out", str(qwen)],
                   cwd=ROOT, check=True, capture_output=True)
    cases = [
        (["evaluate", qwen / "base", "--limit", "2"], "cannot be scored on the demo's tasks"),
        (["evaluate", "demo:base", "--tasks", "code,poetry"], "unknown demo task(s) poetry"),
        (["evaluate", "demo:base", "--limit", "0"], "--limit 0"),
        (["evaluate", "demo:base", "--split", "train"], "no train split"),
        (["evaluate", "demo:base", "--suite", "poetry"], "unknown task suite"),
        (["evaluate", "demo:base", "--include-path", TASKS_DIR], "goes with --lm-eval"),
        (["evaluate", "demo:base", "--tasks", "code", "--lm-eval", "ram_demo_code"], "exclude each other"),
        (["evaluate", "demo:base", "--json", MODELS / "base" / "scores.json"], "inside the input"),
        (["evaluate", tmp_path / "missing", "--limit", "1"], "does not exist"),
    ]
    if __import__("importlib").util.find_spec("lm_eval"):
        cases += [
            (["evaluate", "demo:base", "--lm-eval", "ram_demo_cod", "--include-path", TASKS_DIR],
             "lm-eval knows no task 'ram_demo_cod'"),
            (["evaluate", "demo:base", "--lm-eval", "ram_demo_code_validation", "--include-path", TASKS_DIR,
              "--split", "validation"], "no validation split"),
            (["evaluate", "demo:base", "--lm-eval", "ram_demo_code", "--include-path", tmp_path / "nope"],
             "is not a folder"),
        ]
    for argv, says in cases:
        code, _, err = run(capsys, *argv, "--json", report) if "--json" not in argv else run(capsys, *argv)
        assert code == 2 and says in err, (argv, err)
        assert not report.exists() and not (MODELS / "base" / "scores.json").exists()


@pytest.mark.skipif(not __import__("importlib").util.find_spec("lm_eval"), reason="lm-eval not installed")
def test_lm_eval_cannot_load_the_model(capsys, tmp_path: Path) -> None:
    """Safetensors weights but no config.json: transformers cannot build the model; said in one line, before
    lm-eval starts (every model goes through the same checked loader first)."""
    folder = tmp_path / "weights-only"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((MODELS / "base" / "model.safetensors").read_bytes())
    code, _, err = run(capsys, "evaluate", folder, "--lm-eval", "ram_demo_code", "--include-path", TASKS_DIR)
    assert code == 2 and "cannot load the model" in err and "config.json" in err and err.count("\n") == 1, err


def test_lm_eval_missing_says_how_to_install(tmp_path: Path) -> None:
    """A process where `import lm_eval` fails (a shadowing package that raises ImportError)."""
    shadow = tmp_path / "shadow" / "lm_eval"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named lm_eval')\n")
    env = {**os.environ, "PYTHONPATH": f"{shadow.parent}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, "-m", "ram_studio", "evaluate", "demo:base", "--lm-eval", "ram_demo_code",
                           "--include-path", str(TASKS_DIR)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "not installed" in proc.stderr and "pip install 'ram-studio[eval]'" in proc.stderr

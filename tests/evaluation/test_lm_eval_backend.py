"""lm-evaluation-harness, for real: lm-eval's own CLI scores a demo model on the demo's task definitions with the
built-in evaluator's accuracy; our backend scores a model held in memory (and sees weights written into it);
the task data is what the demo's generators give."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from demo.evaluator import DemoEvaluator
from evaluation.lm_eval_backend import LmEvalEvaluator
from merging.common.errors import Cancelled, RamStudioError
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
TASKS_DIR = ROOT / "assets" / "demo" / "lm_eval_tasks"
MODELS = ROOT / "assets" / "demo" / "models"


def offline_env(tmp_path: Path) -> dict[str, str]:
    """No network, and the datasets cache under the test's folder."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(tmp_path / "datasets")}


@pytest.mark.timeout(600)  # lm-eval's own CLI on 900 examples (2.5 min measured on a loaded 2-core machine)
def test_lm_eval_cli_gives_the_builtin_accuracy(tmp_path: Path) -> None:
    """The issue's command (plus a batch size and an output path) on all three tasks of the test split: each
    accuracy equals the demo evaluator's on the same examples."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf",
           "--model_args", "pretrained=assets/demo/models/tool,dtype=float32",
           "--tasks", "ram_demo_code,ram_demo_tool,ram_demo_memory", "--include_path", "assets/demo/lm_eval_tasks",
           "--batch_size", "64", "--output_path", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=offline_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    ev = DemoEvaluator()
    builtin = ev.score(ev.load(MODELS / "tool"), "test").scores
    for task in ("code", "tool", "memory"):
        assert 100 * results[f"ram_demo_{task}"]["acc,none"] == pytest.approx(builtin[task], abs=1e-9), task


def test_backend_scores_the_model_in_memory() -> None:
    """Validation scores of the group (its `_validation` companion) equal the demo evaluator's; after the code
    agent's weights are copied into the loaded base, the same loaded object scores as the code agent."""
    ev = LmEvalEvaluator(["ram_demo"], TASKS_DIR)
    assert ev.splits() == ("validation", "test") and ev.backend == "hf" and ev.device == "cpu"
    demo = DemoEvaluator()
    model = ev.load(MODELS / "base")
    seen: list[tuple[int, int]] = []
    got = ev.score(model, "validation", limit=40, progress=lambda d, t, w: seen.append((d, t)))
    want = demo.score(demo.load(MODELS / "base"), "validation", limit=40)
    assert {k.removeprefix("ram_demo_").removesuffix("_validation"): v for k, v in got.scores.items()} == want.scores
    assert seen and seen[-1] == (120, 120)
    agent = demo.load(MODELS / "code").module.state_dict()
    for name, tensor in model.module.state_dict().items():
        tensor.copy_(agent[name])
    got = ev.score(model, "test", limit=40)
    want = demo.score(demo.load(MODELS / "code"), "test", limit=40)
    assert {k.removeprefix("ram_demo_"): v for k, v in got.scores.items()} == want.scores
    stop = threading.Event()
    stop.set()
    with pytest.raises(Cancelled):
        ev.score(model, "test", limit=5, cancel=stop)


def test_splits_and_unknown_tasks() -> None:
    only_validation = LmEvalEvaluator(["ram_demo_code_validation"], TASKS_DIR)
    assert only_validation.splits() == ("test",)  # its one split is the one it is scored on
    with pytest.raises(RamStudioError, match="no validation split"):
        only_validation.score(only_validation.load(MODELS / "base"), "validation")
    with pytest.raises(RamStudioError, match="knows no task 'ram_demo_cod'.*Did you mean ram_demo_code"):
        LmEvalEvaluator(["ram_demo_cod"], TASKS_DIR)
    a, b = LmEvalEvaluator(["ram_demo_code"], TASKS_DIR), LmEvalEvaluator(["ram_demo_tool"], TASKS_DIR)
    assert a.fingerprint() != b.fingerprint() and a.fingerprint() == LmEvalEvaluator(["ram_demo_code"],
                                                                                     TASKS_DIR).fingerprint()


def test_task_data_is_current_and_the_budget_cut() -> None:
    """The committed JSONL equals what the generators give; the metric keeps the first N tokens."""
    from assets.demo.lm_eval_tasks import utils  # the module lm-eval loads from beside the YAML files
    from demo.lm_eval_tasks import make_data

    assert make_data.main(["--check"]) == 0
    first = json.loads((TASKS_DIR / "data" / "code_test.jsonl").read_text().splitlines()[0])
    assert first["max_new_tokens"] == 8
    assert utils.within_budget("-12", 8) == "-12"
    assert utils.within_budget("12345678901234", 8) == "12345678"
    ok = utils.process_results(first, [first["answer"] + "999999999"])
    assert ok == {"acc": 0.0} and utils.process_results(first, [first["answer"]]) == {"acc": 1.0}

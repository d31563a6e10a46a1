"""Standard errors and per-example outcomes from the real evaluators: the demo's tasks (binomial, recomputed from
the outcomes and checked against an independent verification of each output), lm-evaluation-harness (equal to
lm-eval's own `acc_stderr` from its CLI), `evaluate --json`, the score store keeping outcomes (and scoring again
an entry stored before it did), and the grid-edge suggestions."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from demo.evaluate import greedy_outputs
from demo.evaluator import DemoEvaluator
from evaluation import verdicts
from evaluation.executors import LocalExecutor
from evaluation.grid import candidate
from evaluation.store import ScoreStore
from evaluation.sweep import SweepSpec, measure
from tests.cli_helpers import run

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "assets" / "demo" / "models"
TASKS_DIR = ROOT / "assets" / "demo" / "lm_eval_tasks"


def test_demo_evaluator_outcomes_and_binomial_standard_errors():
    ev = DemoEvaluator(["code", "memory"])
    model = ev.load(MODELS / "memory")
    s = ev.score(model, "validation", limit=30)
    for task in ("code", "memory"):
        o = np.array(s.outcomes[task])
        assert len(o) == s.n[task] == 30 and set(o) <= {0.0, 1.0}
        assert s.scores[task] == pytest.approx(100 * o.mean())
        assert s.stderr[task] == pytest.approx(100 * o.std() / math.sqrt(len(o)))
        # each outcome is the verifier's verdict on that example's greedy output, in the evaluation set's order
        examples = ev.suite.eval_set(task, "validation", 30)
        outs = greedy_outputs(model.module, model.tokenizer, examples, ev.suite.max_new_tokens)
        assert list(o) == [float(ev.suite.verify(e, x)) for e, x in zip(examples, outs)]
    assert s.average_stderr == pytest.approx(math.sqrt(sum(v ** 2 for v in s.stderr.values())) / 2)
    for key, v in s.detail.items():  # per memory length: binomial on that length's examples
        length = key.split("@")[1]
        sub = [i for i, e in enumerate(ev.suite.eval_set("memory", "validation", 30)) if e.subset == length]
        p = np.array(s.outcomes["memory"])[sub].mean()
        assert v == pytest.approx(100 * p)
        assert s.detail_stderr[key] == pytest.approx(100 * math.sqrt(p * (1 - p) / len(sub)))


@pytest.mark.skipif(not __import__("importlib").util.find_spec("lm_eval"), reason="lm-eval not installed")
def test_lm_eval_standard_error_is_lm_evals_own(tmp_path):
    """Our backend's s.e. equals the `acc_stderr` lm-eval's CLI reports (its closed form for a mean), and its
    outcomes are lm-eval's per-sample values."""
    from evaluation.lm_eval_backend import LmEvalEvaluator

    out = tmp_path / "out"
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets")}
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
           "pretrained=assets/demo/models/tool,dtype=float32", "--tasks", "ram_demo_code,ram_demo_memory",
           "--include_path", "assets/demo/lm_eval_tasks", "--batch_size", "64", "--limit", "25",
           "--output_path", str(out), "--log_samples"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    ev = LmEvalEvaluator(["ram_demo_code", "ram_demo_memory"], TASKS_DIR)
    s = ev.score(ev.load(MODELS / "tool"), "test", limit=25)
    for task in ("ram_demo_code", "ram_demo_memory"):
        assert s.scores[task] == pytest.approx(100 * results[task]["acc,none"])
        assert s.stderr[task] == pytest.approx(100 * results[task]["acc_stderr,none"], rel=1e-9)
        logged = [json.loads(line) for line in next(out.rglob(f"samples_{task}_*.jsonl")).read_text().splitlines()]
        assert s.outcomes[task] == [float(r["acc"]) for r in sorted(logged, key=lambda r: r["doc_id"])]
        o = np.array(s.outcomes[task])
        assert s.stderr[task] == pytest.approx(100 * o.std(ddof=1) / math.sqrt(len(o)))


def test_evaluate_json_results_carry_stderr_and_n(capsys, tmp_path):
    report = tmp_path / "s.json"
    code, out, _ = run(capsys, "evaluate", "demo:code", "--tasks", "code,memory", "--split", "validation",
                       "--limit", "20", "--json", report, "--quiet")
    assert code == 0 and "± s.e." in out and "(standard error, √(Σ se²)/2 over the tasks)" in out
    doc = json.loads(report.read_text())
    assert len(doc["results"]) == 2 + 3  # the two tasks and memory's three lengths
    for r in doc["results"]:
        p = r["correct"] / r["n"]
        assert r["accuracy"] == pytest.approx(p) and r["stderr"] == pytest.approx(math.sqrt(p * (1 - p) / r["n"]))
    for t in ("code", "memory"):
        o = np.array([int(c) for c in doc["outcomes"][t]])
        assert doc["stderr"][t] == pytest.approx(100 * o.std() / math.sqrt(len(o)))
    assert doc["stderr"]["average"] == pytest.approx(math.hypot(doc["stderr"]["code"], doc["stderr"]["memory"]) / 2)
    assert f"{doc['average']:.2f} % ± {doc['stderr']['average']:.2f}" in out


def test_the_store_keeps_outcomes_and_scores_again_what_was_stored_without(tmp_path):
    spec = SweepSpec("demo:base", ["demo:code", "demo:tool", "demo:memory"], [], DemoEvaluator(["code"]), limit=6)
    store = ScoreStore(tmp_path / "store")
    c = candidate("task_arithmetic", {"lambda": 0.7})
    (first,) = measure(spec, [c], "validation", LocalExecutor(), store=store)
    (again,) = measure(spec, [c], "validation", LocalExecutor(), store=store)
    assert again.resumed and again.outcomes == first.outcomes and again.stderr == first.stderr
    assert len(first.outcomes["code"]) == 6
    (f,) = store.folder.glob("*.json")
    doc = json.loads(f.read_text())  # as a store written before outcomes were kept
    for k in ("outcomes", "stderr", "detail_stderr"):
        del doc["result"][k]
    f.write_text(json.dumps(doc))
    (old,) = measure(spec, [c], "validation", LocalExecutor(), store=store)
    assert not old.resumed and old.outcomes == first.outcomes and old.scores == first.scores
    assert "outcomes" in json.loads(f.read_text())["result"]  # written back with them


@pytest.mark.parametrize("method, name, values, high, want", [
    ("task_arithmetic", "lambda", [0.1, 0.3, 0.5, 0.7, 0.9, 1.0], True, [1.2, 1.4]),
    ("task_arithmetic", "lambda", [0.5, 1.0], True, [1.5, 2.0]),
    ("task_arithmetic", "lambda", [0.1, 0.3, 0.5], False, [0.05]),  # λ ≥ 0: 0.1 − 0.2 is not, halfway to 0 is
    ("ties", "density", [0.1, 0.2, 0.3], True, [0.4, 0.5]),
    ("ties", "density", [0.1, 0.2, 0.3], False, [0.05]),  # density in (0, 1]: halfway to the bound
    ("dare_ta", "drop_rate", [0.1, 0.5, 0.9], True, [0.95]),  # drop rate < 1
    ("ram", "eps", [1e-6, 1e-5, 1e-4], True, [1e-3, 1e-2]),  # a decade grid continues by decades
    ("ram_plus", "r", [0.0, 0.1, 0.2], False, []),  # r = 0 is its bound: nothing lies beyond
])
def test_next_values_past_a_grid_edge(method, name, values, high, want):
    assert verdicts.next_values(method, name, values, high) == pytest.approx(want)

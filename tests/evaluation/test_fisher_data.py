"""lm-evaluation-harness tasks as Fisher data: the demo's harness tasks give the demo evaluator's own train
examples (their generated train split), zero-shot contexts with reference targets; a group, a task with no split
a Fisher may use, and N beyond the data are one clear line each."""
from __future__ import annotations

from pathlib import Path

import pytest

from merging.common.errors import RamStudioError

pytest.importorskip("lm_eval")
TASKS = Path(__file__).resolve().parents[2] / "assets" / "demo" / "lm_eval_tasks"


@pytest.fixture(scope="module")
def harness():
    from evaluation.lm_eval_backend import LmEvalEvaluator

    return LmEvalEvaluator(["ram_demo_tool", "ram_demo_code_validation", "ram_demo"], TASKS, backend="hf",
                           device="cpu")


def test_demo_harness_task_gives_the_demo_train_examples(harness):
    from demo.evaluator import DemoEvaluator

    ours = harness.fisher_examples("ram_demo_tool", 5)
    demo = DemoEvaluator().fisher_examples("tool", 5)
    assert ours.split == "train" and ours.task == "ram_demo_tool"
    assert [(e.prompt, e.answer) for e in ours.examples] == [(e.prompt, e.answer) for e in demo.examples]
    assert {e.max_new_tokens for e in ours.examples} == {96} and {e.stop for e in ours.examples} == {()}
    assert ours.source.startswith("lm-eval|") and "greedy" in ours.rules
    assert harness.fisher_origin() == {"backend": "lm-eval", "include_path": str(TASKS)}


def test_what_a_harness_task_cannot_give_is_one_line(harness):
    with pytest.raises(RamStudioError, match="has 2048 examples in its train split; the Fisher asks for 3000"):
        harness.fisher_examples("ram_demo_tool", 3000)
    with pytest.raises(RamStudioError, match="no training split"):
        harness.fisher_examples("ram_demo_code_validation", 4)  # validation only: the split it is scored on
    with pytest.raises(RamStudioError, match="is a group of 3 tasks"):
        harness.fisher_examples("ram_demo", 4)

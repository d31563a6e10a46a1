"""Cancelling the Fisher pass (a merge job's Cancel, Ctrl-C in the CLI): it stops before the next example; only the
complete snapshots published before stay in the cache, nothing partial and no temporary file; the next run
computes what is missing."""
from __future__ import annotations

import threading

import pytest
import torch

from demo.evaluator import DemoEvaluator
from evaluation.fisher import FisherPlan, agent_prints, ensure_fishers
from evaluation.fisher_cache import fisher_dir
from merging.common.errors import Cancelled
from merging.reading.checkpoint import open_checkpoint
from tests.evaluation.test_fisher_pass import tiny_demo_model

CPU = torch.device("cpu")


def test_a_cancelled_pass_publishes_nothing_and_the_next_run_computes_it(tmp_path):
    base = open_checkpoint(tiny_demo_model(tmp_path / "base"))
    agents = [open_checkpoint(tiny_demo_model(tmp_path / name, seed=s)) for name, s in (("code", 1), ("tool", 2))]
    plan = FisherPlan(("code", "tool"), "greedy", (2, 6))
    cancel, seen = threading.Event(), []

    def progress(done: int, total: int, text: str) -> None:
        seen.append(text)
        if done == 3:  # after the snapshot at N = 2 of the first agent: its N = 6 is never reached
            cancel.set()

    with pytest.raises(Cancelled):
        ensure_fishers(DemoEvaluator(), base, agents, agent_prints(agents), plan, device=CPU, progress=progress,
                       cancel=cancel)
    assert len(seen) == 3 and "agent 1 of 2" in seen[-1]
    left = sorted(p.name for p in fisher_dir().iterdir())
    assert not [n for n in left if n.endswith(".tmp")]
    assert len([n for n in left if n.endswith(".safetensors")]) == 1  # the snapshot at N = 2, complete, kept
    found = ensure_fishers(DemoEvaluator(), base, agents, agent_prints(agents), plan, device=CPU)
    assert [sorted(f) for f in found] == [[2, 6], [2, 6]]
    assert len(list(fisher_dir().glob("*.safetensors"))) == 4

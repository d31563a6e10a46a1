"""The Fisher cache's write-time placement: its folder is checked when the pass starts and again before each file is
published, and written through the handle opened at the check; a folder swapped for a link into an input during
the pass gets nothing, and an entry another writer published first is kept, not replaced."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from demo.evaluator import DemoEvaluator
from evaluation.fisher import FisherPlan, agent_prints, ensure_fishers
from evaluation.fisher_cache import check_cache_location, fisher_dir, lookup, publish
from merging.common.errors import RamStudioError
from merging.reading.checkpoint import open_checkpoint
from merging.writing.shards import PlannedTensor
from tests.evaluation.test_fisher_pass import tiny_demo_model

CPU = torch.device("cpu")


def listing(folder) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))}


def test_a_fisher_folder_swapped_for_a_link_into_an_input_gets_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RAM_STUDIO_CACHE", str(tmp_path / "cache"))
    base = open_checkpoint(tiny_demo_model(tmp_path / "base"))
    agent = open_checkpoint(tiny_demo_model(tmp_path / "code", seed=1))
    before = listing(tmp_path / "code")
    swapped = []

    def swap(done: int, total: int, text: str) -> None:  # mid-pass: the checked folder moves, a link takes its place
        if not swapped:
            fisher_dir().rename(tmp_path / "moved")
            os.symlink(tmp_path / "code", fisher_dir())
            swapped.append(text)

    with pytest.raises(RamStudioError, match="changed while this command ran"):
        ensure_fishers(DemoEvaluator(), base, [agent], agent_prints([agent]), FisherPlan(("code",), "reference", (2,)),
                       device=CPU, progress=swap)
    assert swapped and listing(tmp_path / "code") == before
    assert list((tmp_path / "moved").iterdir()) == []  # the temporary file was ours: removed


def test_an_entry_another_writer_published_first_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("RAM_STUDIO_CACHE", str(tmp_path / "cache"))
    base = open_checkpoint(tiny_demo_model(tmp_path / "base"))
    planned = [PlannedTensor("w", "F32", (3,))]
    key = "0123456789abcdef0123456789abcdef"
    folder = check_cache_location([base])
    first = publish(key, planned, iter([("w", torch.ones(3))]), {"n": 1}, folder)
    data = first.path.read_bytes()
    second = publish(key, planned, iter([("w", torch.full((3,), 2.0))]), {"n": 2}, folder)
    assert second.path == first.path and first.path.read_bytes() == data and second.sidecar["n"] == 1
    assert lookup(key).sidecar["n"] == 1
    assert sorted(p.name for p in fisher_dir().iterdir()) == [f"{key}.json", f"{key}.safetensors"]
    with pytest.raises(RamStudioError, match="overflows float32"):
        publish("f" * 32, planned, iter([("w", torch.tensor([1.0, float("inf"), 0.0]))]), {"n": 1}, folder)
    assert sorted(p.name for p in fisher_dir().iterdir()) == [f"{key}.json", f"{key}.safetensors"]
    folder.close()


def test_a_fisher_cache_inside_the_lm_eval_task_folder_is_refused(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    import shutil

    from evaluation.lm_eval_backend import LmEvalEvaluator
    from tests.factory import checksums

    tasks = shutil.copytree(Path(__file__).resolve().parents[2] / "assets" / "demo" / "lm_eval_tasks",
                            tmp_path / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("RAM_STUDIO_CACHE", str(tasks / "cache"))
    base = open_checkpoint(tiny_demo_model(tmp_path / "base"))
    agent = open_checkpoint(tiny_demo_model(tmp_path / "code", seed=1))
    before = checksums([tasks])
    ev = LmEvalEvaluator(["ram_demo_code"], tasks, backend="hf")
    with pytest.raises(RamStudioError, match="Fisher cache folder .* inside the input"):
        ensure_fishers(ev, base, [agent], agent_prints([agent]), FisherPlan(("ram_demo_code",), "reference", (2,)),
                       device=CPU)
    assert checksums([tasks]) == before and not (tasks / "cache").exists()

"""Shared fixtures: an isolated analysis cache, tiny real model families, and the suite-wide check that
no test ever changes an input: every shared input is hashed when created and again when the run ends."""
from __future__ import annotations

import json

from merging.common.threads import openmp_waits_passively

openmp_waits_passively()  # as every command does, before torch loads OpenMP (a test run is one command)

import pytest  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file

from tests.factory import checksums, make_family


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own analysis cache and sweep score store, so results never leak between tests."""
    monkeypatch.setenv("RAM_STUDIO_CACHE", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("RAM_STUDIO_SWEEP_CACHE", str(tmp_path_factory.mktemp("sweeps")))


def _unchanged_at_the_end(folders):
    """Hash the folders now; after the whole run (fixture teardown) they must hash the same."""
    before = checksums(folders)
    yield
    after = checksums(folders)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"inputs changed during the test run: {changed[:5]}"


@pytest.fixture(scope="session", autouse=True)
def bundled_demo_untouched():
    """The committed demo models are inputs of many tests (demo:base …): they must never change."""
    from merging.reading.refs import BUNDLED_DEMO_ROOT

    yield from _unchanged_at_the_end([BUNDLED_DEMO_ROOT] if BUNDLED_DEMO_ROOT.is_dir() else [])


@pytest.fixture(scope="session", autouse=True)
def repository_root_untouched():
    """No test writes into the checkout's root (a recipe's `./NAME` once landed there): its entries are listed
    before the run and must be the same after it; test artifacts go to their own ignored folder."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    ignored = {"test-artifacts", ".hypothesis", ".pytest_cache", "ram_studio.egg-info"}
    before = {p.name for p in root.iterdir()}
    yield
    new = sorted({p.name for p in root.iterdir()} - before - ignored)
    assert not new, f"tests wrote into the repository root: {[ascii(n) for n in new[:5]]}"


@pytest.fixture(scope="session")
def family(tmp_path_factory):
    """Base (2 shards + index) and three agents with densities 5 %, 40 %, 50 %; checked unchanged at the end."""
    base, agents = make_family(tmp_path_factory.mktemp("family"))
    for _ in _unchanged_at_the_end([base, *agents]):
        yield base, agents


@pytest.fixture(scope="session")
def slow_family(tmp_path_factory):
    """Four 1024×2048 bf16 tensors per model (16 MB): with small chunks a merge takes seconds."""
    root = tmp_path_factory.mktemp("slow")
    g = torch.Generator().manual_seed(0)
    base = {f"model.layers.{i}.mlp.up_proj.weight": (torch.randn(1024, 2048, generator=g) * 0.02).to(torch.bfloat16)
            for i in range(4)}
    folders = []
    for k, name in enumerate(["base", "a", "b", "c"]):
        folder = root / name
        folder.mkdir()
        if k == 0:
            t = base
        else:
            t = {n: (v.float() + torch.randn(v.shape, generator=g) * 0.01 * (torch.rand(v.shape, generator=g) < 0.3))
                 .to(torch.bfloat16) for n, v in base.items()}
        save_file(t, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}))
        folders.append(folder)
    for _ in _unchanged_at_the_end(folders):
        yield folders[0], folders[1:]


@pytest.fixture(scope="session")
def families(tmp_path_factory):
    """Tiny real checkpoints of each model family (tests/families.py), built on first use and kept for the
    session; every folder built is checked unchanged at the end."""
    from tests.families import Families

    f = Families(tmp_path_factory.mktemp("families"))
    yield f
    changed = f.changed()
    assert not changed, f"inputs changed during the test run: {changed[:5]}"

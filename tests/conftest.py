"""Shared fixtures: an isolated analysis cache, tiny real model families, and the suite-wide check that
no test ever changes an input: every shared input is hashed when created and again when the run ends."""
from __future__ import annotations

import json
import shutil

from merging.common.threads import openmp_waits_passively

openmp_waits_passively()  # as every command does, before torch loads OpenMP (a test run is one command)

import pytest  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from tests.factory import checksums, make_family  # noqa: E402

# The two halves of the kernels, about equal in compile time: measured alone (both dtypes, s) overlap_histogram 52,
# tensor_stats 45, count_and_peak 18 (with numba's import), ram 10, ties_merge 9, dare 9, linear 7,
# abs_bits_histogram 7, peak_abs_tau 6, the two guards 1 → 80 and 83 s.
_KERNEL_HALVES = (("overlap_histogram", "peak_abs_tau", "linear", "abs_bits_histogram", "dare"),
                  ("tensor_stats", "count_and_peak", "ram", "ties_merge", "first_nonfinite", "values_differ"))


def pytest_sessionstart(session):
    """On a fresh checkout, compile the numba kernels once, before the test workers start: otherwise every worker
    compiled all of them on its warm-up thread (about 4 min of CPU each) and every command a test ran meanwhile
    started compiling too, all on two cores. Two processes share the work (disjoint kernels, so never the same
    cache file); a third loads them all and notes them as cached. Runs without workers (`-n 0`) compile in the
    background as a user's first command does."""
    import subprocess
    import sys
    import time

    from merging.kernels import ALL, DTYPES, cached_marker_exists, kernels_enabled

    workers = getattr(session.config.option, "numprocesses", None) or 0
    if hasattr(session.config, "workerinput") or workers < 2 or not kernels_enabled():
        return
    if all(cached_marker_exists(d) or cached_marker_exists(d, ALL) for d in DTYPES):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    start = time.perf_counter()
    if reporter:
        reporter.write_line("compiling the numba kernels once for all workers (a fresh checkout: about 2 minutes)")
    halves = [subprocess.Popen([sys.executable, "-m", "merging.kernels", *half], stdout=subprocess.DEVNULL)
              for half in _KERNEL_HALVES]
    codes = [p.wait() for p in halves]
    if codes == [0, 0]:
        codes.append(subprocess.run([sys.executable, "-m", "merging.kernels"], stdout=subprocess.DEVNULL).returncode)
    if reporter:
        reporter.write_line("kernels "
                            f"{'ready' if set(codes) == {0} else 'NOT compiled (exit codes ' + str(codes) + ')'}"
                            f" in {time.perf_counter() - start:.0f} s")


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


@pytest.fixture()
def models(family, tmp_path):
    """A private copy of the tiny family under tmp/models (tests may point outputs at it)."""
    base, agents = family
    root = tmp_path / "models"
    copies = [shutil.copytree(p, root / p.name) for p in [base, *agents]]
    return copies[0], copies[1:]

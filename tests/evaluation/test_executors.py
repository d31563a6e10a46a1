"""`--executor ray`: candidates run as Ray tasks on a local Ray instance this test starts (2 CPUs, no dashboard,
no token file, its files under the test's tmp); the table equals the local executor's."""
from __future__ import annotations

import functools

import pytest

from demo.evaluator import DemoEvaluator
from evaluation.executors import LocalExecutor, RayExecutor
from evaluation.grid import parse_try
from evaluation.store import ScoreStore
from evaluation.sweep import SweepSpec, run_sweep

DEMO = ["demo:base", "demo:code", "demo:tool", "demo:memory"]
GRIDS = ["task_arithmetic lambda=0.3,1.0", "ties lambda=1.0 density=0.1,0.3",
         "dare_ties lambda=@ties drop_rate=0.3,0.7", "ram_plus r=0,0.1"]


@pytest.fixture
def local_ray(tmp_path_factory, monkeypatch):
    import ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_worker_niceness", "0")  # as the CLI's local instance: Ray's +15 starves the workers
    # the session folder holds unix sockets (at most 107 bytes of path): a short folder of the test run's tmp
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=str(tmp_path_factory.mktemp("ray")), log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def view(res) -> list[tuple]:
    return [(e.kind, e.label, e.split, e.params, e.scores, e.detail, e.n, e.average, e.selected, e.best, e.error)
            for e in res.entries]


def test_ray_table_equals_local(local_ray, tmp_path):
    # each Ray worker builds its own evaluator (on its own device), the driver keeps one for splits and keys
    spec = SweepSpec(DEMO[0], DEMO[1:], [parse_try(g) for g in GRIDS], DemoEvaluator(["code", "memory"]), limit=6,
                     make_evaluator=functools.partial(DemoEvaluator, ["code", "memory"]))
    local = run_sweep(spec, LocalExecutor(), store=ScoreStore(tmp_path / "local"))
    seen = []
    remote = run_sweep(spec, RayExecutor(), store=ScoreStore(tmp_path / "ray-store"),
                       progress=lambda p: seen.append(p.done))
    assert view(remote) == view(local)
    assert remote.selected == local.selected and remote.best == local.best
    assert not any(e.resumed for e in remote.entries)
    assert len(remote.candidates("validation")) == 2 + 2 + 2 + 2 and seen[-1] == len(remote.entries)
    assert local_ray.cluster_resources().get("CPU") == 2  # the instance this test started, still up

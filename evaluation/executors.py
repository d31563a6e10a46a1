"""Where a sweep's scorings run: in this process (`LocalExecutor`, the default) or as Ray tasks across a
cluster (`RayExecutor`: one worker per GPU, or per CPU where there is none; a local instance bound to loopback,
token-authenticated and ended with the sweep: evaluation/ray_local.py).

A `Worker` is what runs scorings: it opens and checks the inputs once (kept resident where they fit), loads
the base into the evaluator once, and for each job writes the candidate's weights (or an input model's)
into that one loaded model and scores it. Every worker computes the same bits, so where a job runs never
changes its score: the tables of both executors are equal (tests compare).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from analysis.noise import pack_outcomes
from merging.common.errors import Cancelled, RamStudioError
from merging.common.versions import ram_studio_version

from .base import Evaluator
from .ray_local import ray_failure
from .sweep import Executor, Job, SweepProgressFn, SweepResult, SweepSpec, run_sweep


@dataclass
class WorkerSetup:
    """What a worker needs to open the inputs and the evaluator (picklable: Ray ships it to each worker)."""

    base: str
    agents: list[str]
    evaluator: Evaluator | None
    limit: int | None = None
    on_mismatch: str = "error"
    device: str = "auto"
    inputs: str = "auto"
    make_evaluator: Callable[[], Evaluator] | None = None
    fisher_tasks: list[str] | None = None
    fisher_plan: dict[str, tuple[int, ...]] | None = None  # rule → the Ns the grids sweep (evaluation.fisher)

    @classmethod
    def of(cls, spec: SweepSpec, remote: bool = False) -> "WorkerSetup":
        """The setup of `spec`; for a `remote` worker the evaluator is built there when the spec says how."""
        from .fisher import plan_of_grids

        ship = None if remote and spec.make_evaluator is not None else spec.evaluator
        return cls(spec.base, list(spec.agents), ship, spec.limit, spec.on_mismatch, spec.device, spec.inputs,
                   spec.make_evaluator if remote else None, spec.fisher_tasks, plan_of_grids(spec.grids))

    def build_evaluator(self) -> Evaluator:
        return self.evaluator if self.evaluator is not None else self.make_evaluator()


def _versions() -> dict[str, str]:
    import torch
    import transformers

    return {"ram_studio": ram_studio_version(), "torch": torch.__version__, "transformers": transformers.__version__}


class Worker:
    """Inputs opened once, the base loaded once into the evaluator; `run(job)` scores one job in that model."""

    def __init__(self, setup: WorkerSetup, cancel: threading.Event | None = None,
                 progress: Callable[[str, int, int], None] | None = None) -> None:
        from .candidates import CandidateInputs

        def opening(p) -> None:
            if progress is not None:
                progress(f"reading and checking the inputs ({p.tensors_done}/{p.tensors_total} tensors)", p.done,
                         p.total)

        self.setup = setup
        self.evaluator = setup.build_evaluator()
        self.inputs = CandidateInputs(setup.base, setup.agents, on_mismatch=setup.on_mismatch, device=setup.device,
                                      mode=setup.inputs, cancel=cancel, progress=opening)
        if progress is not None:
            progress("loading the base into the evaluator", 0, 0)
        self.loaded = self.evaluator.load(self.inputs.base.folder)
        self._fishers = self._fisher_tasks() if setup.fisher_plan else None  # a wrong task: said at the start

    def _fisher_tasks(self):
        from .fisher import SweepFishers

        return SweepFishers(self.evaluator, self.inputs, self.loaded, self.setup.fisher_tasks,
                            self.setup.fisher_plan or {})

    def context(self) -> dict[str, Any]:
        """Labels, fingerprints and the resume key's context (everything a score depends on but the job)."""
        ev = self.evaluator
        ins = self.inputs
        return {
            "labels": [ins.base.label, *ins.labels],
            "fingerprints": list(ins.fingerprints),
            "inputs": "resident" if ins.resident else "stream",
            "device": str(ins.device),
            "notes": list(ins.notes),
            "key": {"inputs": list(ins.fingerprints), "on_mismatch": ins.spec.on_mismatch,
                    "evaluator": ev.name, "evaluator_fingerprint": ev.fingerprint(), "tasks": list(ev.tasks),
                    "limit": self.setup.limit, "versions": _versions()},
            **({"fisher": self._fishers.context()} if self._fishers is not None else {}),
        }

    def run(self, job: Job, cancel: threading.Event | None = None,
            on_examples: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
        """Merge (or load) and score one job; a merge the engine refuses (e.g. a non-finite output) is a result
        with `error`, not a failure of the sweep."""
        module, loaded = self.loaded.module, self.loaded
        t0 = time.perf_counter()
        out: dict[str, Any] = {}
        if job.candidate is not None:
            c = job.candidate
            try:
                side = self._side(c, cancel, on_examples)
                if side is not None:
                    out["fisher_s"] = side[1]
                made = self.inputs.merge_into(module, c.method, c.param_dict, cancel=cancel,
                                              side=None if side is None else side[0])
            except Cancelled:
                raise
            except RamStudioError as exc:
                return {"error": str(exc), "merge_s": time.perf_counter() - t0}
            out.update(merge_s=made.seconds, changed=made.changed, lambdas=made.lambdas)
        else:
            try:
                self.inputs.load_model_into(module, job.index)
            except RamStudioError:  # shaped unlike the base (a mismatch policy let it in): load it on its own
                loaded = self.evaluator.load([self.inputs.base, *self.inputs.agents][job.index].folder)
            out.update(merge_s=time.perf_counter() - t0)
        what = job.candidate.label if job.candidate is not None else ([self.inputs.base.label, *self.inputs.labels]
                                                                      [job.index])

        def examples(done: int, total: int, text: str) -> None:
            if on_examples is not None:
                on_examples(done, total, f"{what} on {job.split}: {text}" if text else f"{what} on {job.split}")

        t1 = time.perf_counter()
        scores = self.evaluator.score(loaded, job.split, limit=self.setup.limit, progress=examples, cancel=cancel)
        out.update(scores=dict(scores.scores), detail=dict(scores.detail), n=dict(scores.n),
                   average=scores.average, eval_s=scores.seconds or (time.perf_counter() - t1),
                   stderr=dict(scores.stderr), detail_stderr=dict(scores.detail_stderr),
                   outcomes=pack_outcomes(scores.outcomes))
        return out


    def _side(self, c, cancel, on_examples):
        """(side tensors, Fisher-pass seconds) for a candidate that reads each agent's Fisher, else None."""
        from .fisher import reads_fisher

        if not reads_fisher(c.method):
            return None
        if self._fishers is None:
            self._fishers = self._fisher_tasks()

        def step(done: int, total: int, text: str) -> None:
            if on_examples is not None:
                on_examples(done, total, f"Fisher pass for {c.label}: {text}")

        return self._fishers.side(c.param_dict, step, cancel)


class LocalExecutor(Executor):
    """Scorings one after the other in this process, on one loaded model."""

    name = "local"

    def __init__(self) -> None:
        self.worker: Worker | None = None

    def start(self, spec: SweepSpec, cancel: threading.Event | None,
              progress: Callable[[str, int, int], None] | None) -> dict[str, Any]:
        self.worker = Worker(WorkerSetup.of(spec), cancel, progress)
        return self.worker.context()

    def run(self, jobs: list[Job], on_result: Callable[[Job, dict[str, Any]], None],
            cancel: threading.Event | None, on_examples: Callable[[int, int, str], None] | None) -> None:
        assert self.worker is not None
        for job in jobs:
            if cancel is not None and cancel.is_set():
                raise Cancelled("sweep cancelled.")
            on_result(job, self.worker.run(job, cancel, on_examples))

    def close(self) -> None:
        self.worker = None


class WorkerActor:
    """A Worker inside a Ray actor (wrapped with ray.remote at run time, so Ray is imported only when used)."""

    def __init__(self, setup: WorkerSetup) -> None:
        self.worker = Worker(setup)

    def context(self) -> dict[str, Any]:
        return self.worker.context()

    def pid(self) -> int:
        import os

        return os.getpid()

    def run(self, job: Job) -> dict[str, Any]:
        return self.worker.run(job)


class RayExecutor(Executor):
    """Scorings as Ray actor tasks: one worker per GPU of the cluster (each holding one loaded model), or one per CPU
    when there is no GPU; results come back as they finish. Uses the Ray instance already started in this process,
    else joins $RAY_ADDRESS when set, else starts a local instance bound to loopback, token-authenticated, that ends
    with the sweep (evaluation/ray_local.py). A worker that dies holding a scoring (the OOM killer, a lost node) is
    one line (`WorkerLost`); the scores finished before are already stored, so the same command resumes."""

    name = "ray"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers
        self.actors: list[Any] = []
        self.pids: list[int] = []  # the workers' process ids (what a message or a test can point at)
        self.local = None  # the LocalRay this executor started, if any
        self._joined = False  # connected to $RAY_ADDRESS by this executor
        self._ray = None

    def _connect(self, progress: Callable[[str, int, int], None] | None):
        import os

        from .ray_local import LocalRay, import_ray

        cluster = bool(os.environ.get("RAY_ADDRESS"))
        ray = self._ray = import_ray(local=not cluster)
        if ray.is_initialized():
            return ray
        if progress is not None:
            progress("starting Ray", 0, 0)
        if cluster:
            ray.init()
            self._joined = True
        else:
            self.local = LocalRay.start(ray)
        return ray

    def start(self, spec: SweepSpec, cancel: threading.Event | None,
              progress: Callable[[str, int, int], None] | None) -> dict[str, Any]:
        ray = self._connect(progress)
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), max(1, int(resources.get("CPU", 1)))
        n = self.workers or (gpus or cpus)
        options = {"num_gpus": 1, "num_cpus": 1} if gpus else {"num_cpus": 1}
        remote = ray.remote(WorkerActor)
        if progress is not None:
            progress(f"starting {n} Ray worker(s), each reading the inputs", 0, 0)
        setup = WorkerSetup.of(spec, remote=True)
        self.actors = [remote.options(**options).remote(setup) for _ in range(n)]
        self.pids = self._get([a.pid.remote() for a in self.actors], cancel, "starting")
        contexts = self._get([a.context.remote() for a in self.actors], cancel, "reading the inputs")
        if any(c["key"] != contexts[0]["key"] for c in contexts):
            raise RamStudioError("the Ray workers do not see the same inputs (their fingerprints or versions differ).",
                                 "Give every node the same model files and the same RAM Studio install.")
        return contexts[0]

    def _get(self, refs: list[Any], cancel: threading.Event | None, what: str) -> list[Any]:
        ray = self._ray
        pending = list(refs)
        while pending:
            if cancel is not None and cancel.is_set():
                raise Cancelled("sweep cancelled.")
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
        try:
            return ray.get(refs)
        except Exception as exc:  # noqa: BLE001 — a task's own error unwrapped, a lost worker in one line
            raise ray_failure(ray, exc, what) from None

    def run(self, jobs: list[Job], on_result: Callable[[Job, dict[str, Any]], None],
            cancel: threading.Event | None, on_examples: Callable[[int, int, str], None] | None) -> None:
        ray = self._ray
        queue = list(jobs)
        running: dict[Any, tuple[Any, Job]] = {}
        idle = list(self.actors)
        while queue or running:
            while queue and idle:
                actor, job = idle.pop(0), queue.pop(0)
                running[actor.run.remote(job)] = (actor, job)
            if cancel is not None and cancel.is_set():
                raise Cancelled("sweep cancelled.")
            done, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            for ref in done:
                actor, job = running.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:  # noqa: BLE001
                    what = job.candidate.label if job.candidate is not None else f"input model {job.index}"
                    raise ray_failure(ray, exc, f"scoring {what} on {job.split}") from None
                idle.append(actor)
                on_result(job, result)

    def close(self) -> None:
        """Kill our actors; end the local instance this executor started (or leave the cluster it joined)."""
        try:
            if self._ray is not None and self._ray.is_initialized():
                for a in self.actors:
                    try:
                        self._ray.kill(a)
                    except Exception:  # noqa: BLE001 — an actor that is already gone
                        pass
        finally:
            self.actors = []
            if self.local is not None:
                self.local.stop()
                self.local = None
            elif self._joined and self._ray is not None:
                self._ray.shutdown()
                self._joined = False


EXECUTORS: dict[str, Callable[[], Executor]] = {"local": LocalExecutor, "ray": RayExecutor}


def run_local(base: str, agents: list[str], grid_texts: list[str], evaluator: Evaluator, limit: int | None = None,
              *, progress: SweepProgressFn | None = None, cancel: threading.Event | None = None,
              fisher_tasks: list[str] | None = None) -> SweepResult:
    """A sweep of grids given in the `--try` form, in this process, its scores kept in (and resumed from) the
    score store: what the app's Sweep page runs as a background job."""
    from .grid import parse_try
    from .store import ScoreStore

    spec = SweepSpec(base, list(agents), [parse_try(t) for t in grid_texts], evaluator, limit=limit,
                     fisher_tasks=fisher_tasks)
    return run_sweep(spec, LocalExecutor(), store=ScoreStore(), progress=progress, cancel=cancel)

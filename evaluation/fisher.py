"""Each agent's diagonal Fisher on its own task, from the cache or computed (evaluation/fisher_pass.py), and
handed to a merge as side tensors (merging.reading.side_tensors.SideTensors).

An evaluator that can feed a Fisher pass (the demo's, lm-evaluation-harness's) has `fisher_examples(task, n)`
(the first n examples of the task's training data, `FisherData`) and `fisher_origin()` (what a recipe records
to build it again). Which task each agent was trained on: given, or read from the agents' names (an agent
named like a task, or a task named `<anything>_<agent>`, e.g. `ram_demo_code` for `code`).
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch

from merging.common.dtypes import FLOAT_CODES
from merging.common.errors import RamStudioError, printable
from merging.reading.checkpoint import Checkpoint, tensor_order
from merging.reading.side_tensors import SideTensors
from merging.writing.checked_output import CheckedFolder
from merging.writing.shards import PlannedTensor

from .base import LoadedModel
from .fisher_cache import FisherFile, check_cache_location, fisher_key, lookup, publish
from .fisher_pass import FisherData, FisherProgress, PassStats, fisher_pass

KIND = "fisher"


class FisherEvaluator(Protocol):
    """What the Fisher pass needs from an evaluator."""

    name: str

    def load(self, folder: Any) -> LoadedModel: ...

    def fisher_examples(self, task: str, n: int) -> FisherData: ...

    def fisher_origin(self) -> dict[str, Any]: ...


# Loads agent `index` (0-based among the agents) into a model that is already in memory and returns it (a
# sweep's worker writes the agent's stored values into its one loaded model instead of loading another).
LoadInto = Callable[[int], LoadedModel]


@dataclass(frozen=True)
class FisherPlan:
    """Which Fishers a merge or a sweep needs: the task of each agent, the answer rule, the Ns and the seed."""

    tasks: tuple[str, ...]
    rule: str
    ns: tuple[int, ...]
    seed: int = 0


def resolve_tasks(labels: Sequence[str], tasks: Sequence[str], given: Sequence[str] | None) -> tuple[str, ...]:
    """The task of each agent: `given` (one per agent, in order), else the task named like the agent (or
    ending in `_<agent>`) among `tasks`."""
    if given:
        names = tuple(t.strip() for t in given if t.strip())
        if len(names) != len(labels):
            raise RamStudioError(f"{len(names)} Fisher task(s) for {len(labels)} agents.",
                                 "Give one task per agent, in the agents' order "
                                 "(e.g. --fisher-tasks code,tool,memory).")
        return names
    out = []
    for label in labels:
        hits = [t for t in tasks if t == label] or [t for t in tasks if t.endswith("_" + label)]
        if len(hits) != 1:
            raise RamStudioError(f"cannot tell which task agent {printable(label, 80)} was trained on"
                                 + (f" (several match: {', '.join(hits[:3])})." if hits else "."),
                                 "Name each agent's own task, one per agent in order (--fisher-tasks TASK,TASK,… "
                                 "on the command line; the Fisher tasks box in the app).")
        out.append(hits[0])
    return tuple(out)


def fisher_task_names(evaluator: Any) -> tuple[str, ...]:
    """The tasks an agent's name may match: every task the evaluator can give Fisher data for (the demo's whole
    suite, whichever tasks it scores), else the tasks it scores."""
    return tuple(getattr(evaluator, "fisher_tasks", None) or evaluator.tasks)


def agent_prints(agents: list[Checkpoint]) -> list[str]:
    """Each agent's content fingerprint (the merge's `weights_xxh3_128`: every tensor's name and bytes)."""
    from merging.reading.fingerprint import Fingerprinter

    return [p["weights_xxh3_128"] for p in Fingerprinter(list(agents)).finish()]


def _digests(data: FisherData, ns: Sequence[int]) -> dict[int, str]:
    """A hash of the first n examples' text, for each n (part of the cache key)."""
    h, out = hashlib.sha256(), {}
    for i, ex in enumerate(data.examples[:max(ns)]):
        h.update(json.dumps([ex.prompt, ex.answer, ex.max_new_tokens, list(ex.stop)]).encode())
        if i + 1 in ns:
            out[i + 1] = h.copy().hexdigest()
    return out


def _float32_model(loaded: LoadedModel, device: torch.device) -> torch.nn.Module:
    """The loaded module in float32 on `device`, in eval mode (a backend with no module gives no gradients)."""
    if loaded.module is None:
        raise RamStudioError("this evaluator backend holds no torch model, so it gives no gradients (vLLM).",
                             "Compute the Fisher with the hf backend (--backend hf).")
    return loaded.module.to(device=device, dtype=torch.float32).eval()


def ensure_fishers(evaluator: FisherEvaluator, base: Checkpoint, agents: list[Checkpoint], prints: list[str],
                   plan: FisherPlan, *, device: torch.device, load_into: LoadInto | None = None,
                   progress: FisherProgress | None = None, cancel: threading.Event | None = None
                   ) -> list[dict[int, FisherFile]]:
    """Every agent's Fisher at every N of `plan`: from the cache, else one pass per agent (snapshots at the
    missing Ns) on the agent loaded by the evaluator, or into the model `load_into` gives."""
    folder = check_cache_location([base, *agents], getattr(evaluator, "include_path", None))
    try:
        return [_agent_fishers(evaluator, agents, index, fp, plan, folder, device, load_into, progress, cancel)
                for index, fp in enumerate(prints)]
    finally:
        folder.close()


def _agent_fishers(evaluator: FisherEvaluator, agents: list[Checkpoint], index: int, fp: str, plan: FisherPlan,
                   folder: CheckedFolder, device: torch.device, load_into: LoadInto | None,
                   progress: FisherProgress | None, cancel: threading.Event | None) -> dict[int, FisherFile]:
    """One agent's Fishers at every N of `plan`: from the cache, else one pass (snapshots at the missing Ns)."""
    agent = agents[index]
    data = evaluator.fisher_examples(plan.tasks[index], max(plan.ns))
    digests = _digests(data, plan.ns)
    keys = {n: fisher_key(fp, data.source, data.task, data.split, plan.rule, plan.seed, n, digests[n])
            for n in plan.ns}
    found = {n: lookup(k) for n, k in keys.items()}
    missing = sorted(n for n, f in found.items() if f is None)
    if missing:
        def step(done: int, total: int, text: str) -> None:
            if progress is not None:
                progress(done, total, f"agent {index + 1} of {len(agents)} ({agent.label}), {text}")

        found.update(_compute(evaluator, agent, index, fp, data, plan, missing, keys, digests, device, load_into,
                              step, cancel, folder))
    return found


def _compute(evaluator: FisherEvaluator, agent: Checkpoint, index: int, fp: str, data: FisherData, plan: FisherPlan,
             ns: list[int], keys: dict[int, str], digests: dict[int, str], device: torch.device,
             load_into: LoadInto | None, progress: FisherProgress, cancel: threading.Event | None,
             folder: CheckedFolder) -> dict[int, FisherFile]:
    """One pass over the agent, publishing a cache entry at each N of `ns`."""
    t0 = time.perf_counter()
    loaded = load_into(index) if load_into is not None else evaluator.load(agent.folder)
    module = _float32_model(loaded, device)  # in place: a model given by `load_into` is float32 already
    load_s = time.perf_counter() - t0
    names = [n for n in tensor_order(agent) if agent.tensors[n].dtype in FLOAT_CODES]
    planned = [PlannedTensor(n, "F32", agent.tensors[n].shape) for n in names]
    made: dict[int, FisherFile] = {}

    def snapshot(n: int, stats: PassStats, tensors) -> None:
        made[n] = publish(keys[n], planned, tensors, _sidecar(agent, fp, data, plan, n, digests[n], stats, load_s,
                                                             evaluator), folder)

    fisher_pass(module, loaded.tokenizer, data, plan.rule, names, ns, snapshot, seed=plan.seed, progress=progress,
                cancel=cancel)
    return made


def _sidecar(agent: Checkpoint, fp: str, data: FisherData, plan: FisherPlan, n: int, digest: str, stats: PassStats,
             load_s: float, evaluator: FisherEvaluator) -> dict[str, Any]:
    """How one cached Fisher was computed (JSON beside the file)."""
    import transformers

    from merging.common.versions import ram_studio_version

    return {"agent": {"label": agent.label, "ref": agent.ref.raw, "weights_xxh3_128": fp},
            "task": data.task, "split": data.split, "source": data.source, "origin": evaluator.fisher_origin(),
            "rule": plan.rule, "seed": plan.seed, "n": n, "examples_sha256": digest,
            "estimator": "mean over the N examples of the per-example squared gradient of log p(answer | prompt) "
                         "(summed over the answer's tokens), float32, one example at a time",
            "device": stats.device, "seconds": round(stats.seconds[n], 4), "load_seconds": round(load_s, 4),
            "answer_tokens_mean": round(stats.answer_tokens / max(1, stats.examples), 3),
            "empty_answers": stats.empty_answers, "tensors_without_gradient": stats.no_gradient[:50],
            "peak_device_bytes": stats.peak_device_bytes, "notes": list(data.notes),
            "versions": {"ram_studio": ram_studio_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__}}


def side_tensors(files: list[FisherFile], labels: list[str], plan: FisherPlan, origin: dict[str, Any]) -> SideTensors:
    """The merge's side tensors from one N's Fishers (one per agent), with what the recipe records: where the data
    came from, the rule, N and seed, and per agent its task, split, cache key and the seconds its pass took."""
    n = int(files[0].sidecar["n"])
    agents = [{"label": label, "task": f.sidecar["task"], "split": f.sidecar["split"], "key": f.key,
               "weights_xxh3_128": f.sidecar["agent"]["weights_xxh3_128"], "seconds": f.seconds}
              for label, f in zip(labels, files)]
    record = {"origin": origin, "rule": plan.rule, "n": n, "seed": plan.seed, "agents": agents}
    pairs = ", ".join(f"{a['label']} on {a['task']} ({a['split']})" for a in agents)
    notes = (f"Fisher: each agent's diagonal Fisher over N = {n} examples of its own task, {plan.rule} answers: "
             f"{pairs}; {sum(a['seconds'] for a in agents):.1f} s of Fisher pass in all.",)
    return SideTensors(KIND, tuple(f.path for f in files), record, notes,
                       tuple(a["weights_xxh3_128"] for a in agents))


def reads_fisher(method: str) -> bool:
    """Whether `method` reads each agent's Fisher."""
    from merging.methods import get_method

    return get_method(method).side_tensors == KIND


def plan_of_grids(grids: Sequence[Any]) -> dict[str, tuple[int, ...]]:
    """The Ns each answer rule is swept at by Fisher grids (evaluation.grid.Grid): all of a rule's Ns come from
    one pass over each agent, the first time one is needed."""
    from merging.methods import get_method

    plan: dict[str, set[int]] = {}
    for g in grids:
        if not reads_fisher(g.method):
            continue
        decl = {p.name: p.default for p in get_method(g.method).params}
        axes = dict(g.axes)
        rules = [v for v in axes.get("fisher_rule", (decl["fisher_rule"],)) if isinstance(v, str)]
        ns = [v for v in axes.get("fisher_examples", (decl["fisher_examples"],)) if isinstance(v, int)]
        for rule in rules:
            plan.setdefault(rule, set()).update(ns)
    return {rule: tuple(sorted(ns)) for rule, ns in plan.items()}


class SweepFishers:
    """A sweep worker's Fishers: each agent's task resolved once (at the worker's start: a wrong task is one line
    before anything is scored), computed the first time a Fisher candidate needs them — every N of its rule
    the sweep asks for in one pass per agent — in the worker's own loaded model when it computes in float32
    (the agent's stored weights are written into it; the candidate's merge then overwrites them), else in a
    model the evaluator loads for the pass."""

    def __init__(self, evaluator: FisherEvaluator, inputs: Any, loaded: LoadedModel, given: Sequence[str] | None,
                 plan: dict[str, tuple[int, ...]]) -> None:
        self.evaluator, self.inputs, self.loaded, self.plan = evaluator, inputs, loaded, plan
        self.tasks = resolve_tasks(inputs.labels, fisher_task_names(evaluator), given)

    def context(self) -> dict[str, Any]:
        """What every Fisher candidate's score also depends on (part of its resume key)."""
        return {"tasks": list(self.tasks), "origin": self.evaluator.fisher_origin(),
                "data": [self.evaluator.fisher_examples(t, 1).source for t in self.tasks]}

    def _load_into(self, index: int) -> LoadedModel:
        self.inputs.load_model_into(self.loaded.module, index + 1)
        return self.loaded

    def side(self, params: dict[str, Any], progress: FisherProgress | None = None,
             cancel: threading.Event | None = None) -> tuple[SideTensors, float]:
        """The side tensors for a candidate's (rule, N), and the seconds of Fisher pass behind them (all agents)."""
        rule, n = params["fisher_rule"], params["fisher_examples"]
        plan = FisherPlan(self.tasks, rule, tuple(sorted({*self.plan.get(rule, ()), n})))
        module = self.loaded.module
        shared = module is not None and all(p.dtype == torch.float32 for p in module.parameters())
        device = next(module.parameters()).device if module is not None else torch.device("cpu")
        found = ensure_fishers(self.evaluator, self.inputs.base, self.inputs.agents, list(self.inputs.fingerprints[1:]),
                               plan, device=device, load_into=self._load_into if shared else None, progress=progress,
                               cancel=cancel)
        files = [f[n] for f in found]
        side = side_tensors(files, list(self.inputs.labels), FisherPlan(self.tasks, rule, (n,)),
                            self.evaluator.fisher_origin())
        return side, sum(f.seconds for f in files)


def merge_side(spec: Any, evaluator: FisherEvaluator, given: Sequence[str] | None, *,
               progress: FisherProgress | None = None, cancel: threading.Event | None = None) -> SideTensors:
    """A merge's Fisher side tensors (merging.recipe.MergeSpec of method `fisher`): each agent's Fisher at the
    spec's N and rule on its own task of `evaluator` (`given`, else by name), from the cache or computed (on the
    spec's device)."""
    from merging.common.device import pick_device
    from merging.methods import get_method
    from merging.reading.checkpoint import open_checkpoint, unique_labels

    params = get_method(spec.method).resolve_params(spec.params)
    base = open_checkpoint(spec.base)
    agents = [open_checkpoint(a) for a in spec.agents]
    labels = unique_labels([a.label for a in agents])
    n = params["fisher_examples"]
    plan = FisherPlan(resolve_tasks(labels, fisher_task_names(evaluator), given), params["fisher_rule"], (n,))
    found = ensure_fishers(evaluator, base, agents, agent_prints(agents), plan, device=pick_device(spec.device),
                           progress=progress, cancel=cancel)
    return side_tensors([f[n] for f in found], labels, plan, evaluator.fisher_origin())

"""lm-evaluation-harness behind `evaluation.base.Evaluator`: tasks by name (built-in, or YAML files in an
include path), scored in memory — the `hf` backend wraps the already-loaded torch model, so a sweep that writes
each candidate's weights into it never reloads — or through `vllm` from a folder when vLLM is installed.

Splits: "test" scores each task as lm-eval does (its test split, else its validation split). "validation"
scores the `<task>_validation` companion where the task index has one (the demo's tasks, groups included),
else the task's own validation split when it has a separate test split; otherwise the task has no
validation split to select on and `splits()` leaves it out.

Differences from `lm_eval` on the command line, on purpose: the tasks' `max_gen_toks` governs how many tokens
are generated (lm-eval lets a model's `generation_config.max_new_tokens` win; here that field is cleared on the
in-memory model only), the task index skips lm-eval's ~14,000 built-in task files when every task asked for is
in the include path, and no stderr bootstrap is run: a task's standard error is lm-eval's own closed form for
mean-aggregated metrics (`lm_eval.api.metrics.mean_stderr`, sample sd / √n) computed from the per-sample log,
which also gives the per-example outcomes that paired comparisons use. A metric aggregated otherwise (BLEU,
F1, …) gets neither: its score is shown without a standard error and never compared pair by pair.
"""
from __future__ import annotations

import difflib
import hashlib
import random
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from merging.common.errors import Cancelled, RamStudioError, first_line
from merging.reading.transformers_load import load_causal_lm, load_tokenizer, refuse_custom_code

from .base import EvalProgress, LoadedModel, Scores
from .lm_eval_errors import task_errors
from .quiet import quiet_libraries

INSTALL_HINT = "Install it with: pip install 'ram-studio[eval]' (or pip install 'lm-eval[hf]')."
BACKENDS = ("auto", "hf", "vllm")


def require_lm_eval() -> str:
    """lm-eval's version, or a RamStudioError saying how to install it."""
    try:
        import lm_eval
    except ImportError:
        raise RamStudioError("lm-evaluation-harness (lm_eval) is not installed.", INSTALL_HINT) from None
    return getattr(lm_eval, "__version__", "unknown")


def vllm_available() -> bool:
    """True when vLLM can be imported and a CUDA device is present (vLLM's usual setting)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pick_device(device: str = "auto") -> str:
    """`auto`: CUDA when present, else CPU."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def task_manager(tasks: Sequence[str], include_path: Path | None = None):
    """A TaskManager that knows every name in `tasks`: the include path alone when it has them all (no
    reading of lm-eval's built-in task files), else the include path plus the built-ins. Unknown names: a
    RamStudioError naming them, with close matches."""
    from lm_eval.tasks import TaskManager

    with quiet_libraries():
        if include_path is not None:
            if not Path(include_path).is_dir():
                raise RamStudioError(f"--include-path {include_path} is not a folder.",
                                     "Give a folder of lm-eval task YAML files.")
            manager = TaskManager(include_path=str(include_path), include_defaults=False)
            if all(t in manager.all_tasks for t in tasks):
                return manager
        manager = TaskManager(include_path=str(include_path) if include_path else None)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        close = list(dict.fromkeys(m for t in unknown for m in difflib.get_close_matches(t, manager.all_tasks, n=3)))
        where = f" (with --include-path {include_path})" if include_path else ""
        hint = f"Did you mean {', '.join(close)}? " if close else ""
        raise RamStudioError(f"lm-eval knows no task {', '.join(map(repr, unknown))}{where}.",
                             hint + "List the tasks with `lm_eval ls tasks`, or give a folder of task YAML "
                             "files with --include-path.")
    return manager


class LmEvalEvaluator:
    """Scores a model on lm-evaluation-harness tasks; accuracy (%) = each task's first metric × 100."""

    name = "lm-eval"

    def __init__(self, tasks: Sequence[str], include_path: Path | str | None = None, *, backend: str = "auto",
                 device: str = "auto", dtype: str = "auto", batch_size: int | str | None = None) -> None:
        self.version = require_lm_eval()
        self.tasks = tuple(t.strip() for t in tasks if t.strip())
        if not self.tasks:
            raise RamStudioError("no lm-eval task given.", "Pass task names, e.g. --lm-eval ram_demo_tool.")
        if backend not in BACKENDS:
            raise RamStudioError(f"unknown lm-eval backend {backend!r}.", f"Choose one of {', '.join(BACKENDS)}.")
        if backend == "vllm":
            import importlib.util

            if importlib.util.find_spec("vllm") is None:
                raise RamStudioError("the vllm backend needs vLLM, which is not installed.",
                                     "Install it with: pip install vllm (needs a CUDA GPU), or use --backend hf.")
        self.backend = ("vllm" if vllm_available() else "hf") if backend == "auto" else backend
        self.include_path = Path(include_path).resolve() if include_path else None
        self.device = pick_device(device)
        # float32 on the CPU (as the demo evaluator computes); the checkpoint's own dtype on a GPU.
        self.dtype = dtype if dtype != "auto" else ("float32" if self.device == "cpu" else "auto")
        self.batch_size = batch_size if batch_size is not None else (64 if self.device == "cpu" else "auto")
        self.manager = task_manager(self.tasks, self.include_path)
        self._leaves: dict[str, list[str]] = {}

    # ------------------------------------------------------------------ tasks and splits
    def _load(self, names: Sequence[str]) -> dict:
        with quiet_libraries(), task_errors(names, "loading"):
            return self.manager.load(list(names))

    def _split_tasks(self, split: str) -> tuple[list[str], set[str]]:
        """The task names to load for `split`, and the loaded names whose test split must be dropped."""
        if split == "test":
            return list(self.tasks), set()
        if split != "validation":
            raise RamStudioError(f"unknown split {split!r}.", "Choose validation or test.")
        names, drop_test, missing = [], set(), []
        for t in self.tasks:
            companion = f"{t}_validation"
            if companion in self.manager.all_tasks:
                names.append(companion)
                continue
            leaves = self._load([t])["tasks"]
            if all(task.has_test_docs() and task.has_validation_docs() for task in leaves.values()):
                names.append(t)
                drop_test.update(leaves)
            else:
                missing.append(t)
        if missing:
            raise RamStudioError(
                f"lm-eval task(s) {', '.join(map(repr, missing))} have no validation split apart from the split "
                "they are scored on.",
                "Selecting on it would select on the reported scores: give tasks with separate validation and "
                "test splits, or a TASK_validation task in --include-path.")
        return names, drop_test

    def splits(self) -> tuple[str, ...]:
        """("validation", "test") when every task has a separate validation split, else ("test",)."""
        try:
            self._split_tasks("validation")
        except RamStudioError:
            return ("test",)
        return ("validation", "test")

    def fingerprint(self) -> str:
        """lm-eval's version, backend, dtype, tasks, and the content of the include path's files."""
        h = hashlib.sha256(f"lm-eval|{self.version}|{self.backend}|{self.dtype}|{','.join(self.tasks)}".encode())
        if self.include_path is not None:
            for f in sorted(self.include_path.rglob("*")):
                if (f.is_file() and f.suffix in (".yaml", ".yml", ".py", ".jsonl", ".json")
                        and "__pycache__" not in f.parts):
                    h.update(str(f.relative_to(self.include_path)).encode())
                    h.update(f.read_bytes())
        return h.hexdigest()[:16]

    # ------------------------------------------------------------------ Fisher data
    def fisher_examples(self, task: str, n: int):
        """The first `n` documents of one task's training split (else its validation split, when the task has a
        separate test split), as zero-shot contexts with their reference continuations (evaluation/fisher_data.py)."""
        from .fisher_data import lm_eval_fisher_examples

        return lm_eval_fisher_examples(self, task, n)

    def fisher_origin(self) -> dict:
        """What a recipe records to build this evaluator's Fisher data again."""
        return {"backend": "lm-eval", "include_path": str(self.include_path) if self.include_path else None}

    def include_digest(self) -> str:
        """A hash of the include path's task files (empty without one)."""
        h = hashlib.sha256()
        if self.include_path is not None:
            for f in sorted(self.include_path.rglob("*")):
                if (f.is_file() and f.suffix in (".yaml", ".yml", ".py", ".jsonl", ".json")
                        and "__pycache__" not in f.parts):
                    h.update(str(f.relative_to(self.include_path)).encode())
                    h.update(f.read_bytes())
        return h.hexdigest()[:16]

    # ------------------------------------------------------------------ models
    def load(self, folder: Path) -> LoadedModel:
        """hf: the model in memory on the device (see `dtype`), with lm-eval's wrapper; vllm: a vLLM engine."""
        folder = Path(folder)
        with quiet_libraries():
            try:
                refuse_custom_code(folder)  # one clear line before any loader could ask about the folder's code
                if self.backend == "vllm":
                    from lm_eval.models.vllm_causallms import VLLM

                    engine = VLLM(pretrained=str(folder), dtype=self.dtype, batch_size=self.batch_size,
                                  trust_remote_code=False)
                    return LoadedModel(module=None, tokenizer=None, source=folder, backend=engine)
                import torch

                dtype = "auto" if self.dtype == "auto" else getattr(torch, self.dtype)
                module = load_causal_lm(folder, dtype)
                tokenizer = load_tokenizer(folder)
            except RamStudioError:
                raise
            except Exception as exc:  # noqa: BLE001 — whatever transformers/vLLM raise, one line for the user
                raise RamStudioError(f"lm-eval cannot load the model in {folder}: {first_line(exc)}.",
                                     "Give a Hugging Face causal-LM folder with safetensors weights and a "
                                     "tokenizer.") from None
            module.to(self.device).eval()
            if getattr(module.generation_config, "max_new_tokens", None) is not None:
                module.generation_config.max_new_tokens = None  # in memory only: the task's max_gen_toks governs
        return LoadedModel(module=module, tokenizer=tokenizer, source=folder)

    def _lm(self, model: LoadedModel):
        """lm-eval's model object for `model` (made once and kept on it)."""
        if model.backend is not None:
            return model.backend
        with quiet_libraries():
            model.backend = _progress_hflm()(pretrained=model.module, tokenizer=model.tokenizer,
                                             batch_size=self.batch_size, trust_remote_code=False)
        return model.backend

    # ------------------------------------------------------------------ scoring
    def score(self, model: LoadedModel, split: str, *, limit: int | None = None,
              progress: EvalProgress | None = None, cancel: threading.Event | None = None) -> Scores:
        """Score the model as it is in memory now: each task's first metric × 100, per leaf task."""
        from lm_eval.evaluator import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED, evaluate
        from lm_eval.utils import set_torch_seed

        t0 = time.perf_counter()
        names, drop_test = self._split_tasks(split)
        lm = self._lm(model)
        loaded = self._load(names)
        for name, task in loaded["tasks"].items():
            if name in drop_test:
                task.set_config(key="test_split", value=None)
            if task.get_config("num_fewshot") is None:  # as lm-eval's simple_evaluate does
                task.set_config(key="num_fewshot", value=0)
            task.set_fewshot_seed(seed=DEFAULT_OTHER_SEED)
        random.seed(DEFAULT_RANDOM_SEED)
        import numpy as np

        np.random.seed(DEFAULT_OTHER_SEED)
        set_torch_seed(DEFAULT_OTHER_SEED)
        if hasattr(lm, "watch"):
            lm.watch(progress, cancel)
        try:
            with quiet_libraries(), task_errors(names, "scoring"):
                out = evaluate(lm=lm, task_dict=loaded, limit=limit, bootstrap_iters=0, log_samples=True)
        finally:
            if hasattr(lm, "watch"):
                lm.watch(None, None)
        scores = _scores(out, loaded["tasks"], split, time.perf_counter() - t0)
        # A TASK_validation companion reports under its test task's name, so that one task is one column
        # whatever the split (a sweep's tables compare candidates across splits).
        suffix = "_validation"
        renamed = {k: (k[:-len(suffix)] if k.endswith(suffix) and k not in drop_test else k) for k in scores.scores}
        scores.scores = {renamed[k]: v for k, v in scores.scores.items()}
        scores.n = {renamed.get(k, k): v for k, v in scores.n.items()}
        scores.stderr = {renamed.get(k, k): v for k, v in scores.stderr.items()}
        scores.outcomes = {renamed.get(k, k): v for k, v in scores.outcomes.items()}
        return scores


def _scores(out: dict, tasks: dict, split: str, seconds: float) -> Scores:
    """Per leaf task: its first metric (first filter) × 100 as the score; every metric in `detail`."""
    scores: dict[str, float] = {}
    n: dict[str, int] = {}
    detail: dict[str, float] = {}
    stderr: dict[str, float] = {}
    outcomes: dict[str, list[float]] = {}
    for name, task in tasks.items():
        res = out["results"].get(name, {})
        metric = task.config.metric_list[0]["metric"] if task.config.metric_list else None
        keys = [k for k in res if "," in k and not k.split(",")[0].endswith("_stderr")]
        main = next((k for k in keys if k.split(",")[0] == metric), keys[0] if keys else None)
        if main is None or not isinstance(res[main], (int, float)):
            continue
        scores[name] = 100.0 * float(res[main])
        n[name] = int(out.get("n-samples", {}).get(name, {}).get("effective", 0))
        for k in keys:
            if isinstance(res[k], (int, float)):
                detail[f"{name}/{k}"] = float(res[k])
        values = _sample_values(out.get("samples", {}).get(name, []), task, main)
        if values is not None:
            from lm_eval.api.metrics import mean_stderr

            outcomes[name] = values
            if len(values) > 1:
                stderr[name] = 100.0 * float(mean_stderr(values))
    return Scores(split=split, scores=scores, n=n, seconds=seconds, detail=detail, stderr=stderr, outcomes=outcomes)


def _sample_values(samples: list, task, main: str) -> list[float] | None:
    """The per-sample values of the task's main metric (`metric,filter`), in doc_id order, when lm-eval
    aggregates it by its mean and every value lies in [0, 1]; else None (no closed-form standard error)."""
    from lm_eval.api.metrics import mean

    metric, _, filter_key = main.partition(",")
    try:
        if task.aggregation().get(metric) is not mean:
            return None
    except Exception:  # noqa: BLE001 — a task without aggregations: no standard error
        return None
    rows = sorted((s for s in samples if s.get("filter") == filter_key and metric in s), key=lambda s: s["doc_id"])
    values = []
    for s in rows:
        v = s[metric]
        if not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:  # bools count as 0 / 1
            return None
        values.append(float(v))
    return values or None


_PROGRESS_CLASS: Any = None


def _progress_hflm():
    """HFLM that reports rows generated to a progress callback and stops between batches when cancelled."""
    global _PROGRESS_CLASS
    if _PROGRESS_CLASS is not None:
        return _PROGRESS_CLASS
    from lm_eval.models.huggingface import HFLM

    class ProgressHFLM(HFLM):
        _progress: EvalProgress | None = None
        _cancel: threading.Event | None = None
        _done = 0
        _total = 0

        def watch(self, progress: EvalProgress | None, cancel: threading.Event | None) -> None:
            self._progress, self._cancel = progress, cancel

        def _tick(self, rows: int, what: str) -> None:
            if self._cancel is not None and self._cancel.is_set():
                raise Cancelled("evaluation cancelled.")
            self._done += rows
            if self._progress is not None and rows:
                self._progress(min(self._done, self._total), self._total, what)

        def generate_until(self, requests, disable_tqdm: bool = False):
            self._done, self._total = 0, len(requests)
            self._tick(0, "generating")
            return super().generate_until(requests, disable_tqdm=True)

        def _model_generate(self, context, max_length, stop, **generation_kwargs):
            out = super()._model_generate(context, max_length, stop, **generation_kwargs)
            self._tick(int(context.shape[0]), "generating")
            return out

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            self._done, self._total = 0, len(requests)
            self._tick(0, "scoring")
            return super().loglikelihood(requests, disable_tqdm=True)

        def _model_call(self, inps, attn_mask=None, labels=None):
            out = super()._model_call(inps, attn_mask=attn_mask, labels=labels)
            self._tick(int(inps.shape[0]), "scoring")
            return out

    _PROGRESS_CLASS = ProgressHFLM
    return ProgressHFLM

"""Toy agentic tasks (code / tool / memory) with deterministic generators and programmatic verifiers.

Each task is one file of this package declaring a `DemoTask` (`base.py`): its generator, verifier, decoding
budget, seed offset, reward and subsets. The file is imported below automatically, and everything else — the
suites, the evaluation sets, the lm-eval task files (`lm_eval_tasks/make_data.py`), the CLI's and the app's task
lists — is derived from these declarations.

Every example also carries a *habit*: the answer a careless agent typically gives (code: forgets
the last operation; tool: makes only the first of several parallel calls; memory: answers with the
last two digits it read instead of the needle). The end of the base's warm-up corpus is of mixed
quality — a share of its demonstrations show the habit instead of the right answer — so the base
is partially competent and RL from verifier rewards has a real behaviour to fix. Verifiers never accept a habit
answer that differs from the right one.

Splits are disjoint by construction: every prompt is assigned to exactly one split by a stable hash
of its text (train 80 %, validation 10 %, test 10 %); each split's generator only keeps prompts
whose hash bucket belongs to that split, and each split draws from its own seed range.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
import random
from typing import Callable, Iterable, Iterator

from .base import DECLARED, SEPARATOR, SPLIT_SEED_BASE, SPLITS, DemoTask, Example, declare, split_of

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module != "base":
        importlib.import_module(f"{__name__}.{_module}")

# Derived from the declarations, in the order of their seed offsets.
TASKS: tuple[str, ...] = tuple(sorted(DECLARED, key=lambda name: DECLARED[name].seed_offset))
MAX_NEW_TOKENS: dict[str, int] = {t: DECLARED[t].max_new_tokens for t in TASKS}  # decoding budget per task
VERIFIERS: dict[str, Callable[[Example, str], bool]] = {t: DECLARED[t].verify for t in TASKS}
SUBSET_TASKS: tuple[str, ...] = tuple(t for t in TASKS if DECLARED[t].by_subset)  # also reported per subset
EVAL_SIZES: dict[str, int] = {"validation": 150, "test": 300}

__all__ = ["EVAL_SIZES", "MAX_NEW_TOKENS", "SEPARATOR", "SPLITS", "SUBSET_TASKS", "TASKS", "VERIFIERS", "DemoTask",
           "Example", "declare", "declared", "eval_set", "iter_examples", "make_split", "reward", "sample_train",
           "score_columns", "split_of", "subset_key", "verify"]


def declared(task: str) -> DemoTask:
    """A task's declaration (ValueError for a name no file declares)."""
    if task not in DECLARED:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    return DECLARED[task]


def verify(example: Example, output: str) -> bool:
    """Dispatch to the task's verifier."""
    return DECLARED[example.task].verify(example, output)


def reward(example: Example, output: str) -> float:
    """RL reward from the verifier: the task's own reward where it declares one (tool: call-level F1, 1.0 exactly
    when the verifier accepts), else the verifier's 0/1."""
    return DECLARED[example.task].rewarded(example, output)


def iter_examples(task: str, split: str, seed: int = 0) -> Iterator[Example]:
    """Endless deterministic stream of unique examples of `task` belonging to `split`."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    spec = declared(task)
    rng = random.Random(SPLIT_SEED_BASE[split] + spec.seed_offset + seed)
    seen: set[str] = set()
    index = 0
    while True:
        prompt, answer, subset, habit = spec.generate(rng, index)
        if prompt in seen or split_of(prompt) != split:
            continue
        seen.add(prompt)
        index += 1
        yield Example(task, subset, prompt, answer, habit)


def make_split(task: str, split: str, n: int, seed: int = 0) -> list[Example]:
    """The first `n` examples of a split (fixed for a given seed)."""
    stream = iter_examples(task, split, seed)
    return [next(stream) for _ in range(n)]


def eval_set(task: str, split: str, limit: int | None = None) -> list[Example]:
    """The fixed evaluation set of a split (memory: balanced over context lengths)."""
    n = EVAL_SIZES.get(split, 300)
    if limit is not None:
        n = min(n, limit)
    return list(_fixed_split(task, split, n))


@functools.lru_cache(maxsize=64)
def _fixed_split(task: str, split: str, n: int) -> tuple[Example, ...]:
    """`make_split`, made once per process (a sweep scores the same sets for every candidate)."""
    return tuple(make_split(task, split, n))


def sample_train(task: str, rng: random.Random) -> Example:
    """One training example drawn with replacement from the train split (hash-filtered; the task's own training
    draw, e.g. memory's shorter contexts)."""
    spec = declared(task)
    while True:
        prompt, answer, subset, habit = spec.draw_train(rng)
        if split_of(prompt) == "train":
            return Example(task, subset, prompt, answer, habit)


def subset_key(subset: str) -> tuple[int, object]:
    """Subsets in numeric order when they are numbers (memory's context lengths), else by name."""
    return (0, int(subset)) if subset.isdigit() else (1, subset)


def score_columns(columns: Iterable[object]) -> list[str]:
    """The score columns of a wide accuracy table, in the order tables show them: every task, then the per-subset
    columns (`task@subset`) among `columns` of the tasks reported by subset, in subset order."""
    per_subset = [str(c) for c in columns if "@" in str(c) and not str(c).endswith("_se")
                  and str(c).split("@", 1)[0] in SUBSET_TASKS]
    per_subset.sort(key=lambda c: (SUBSET_TASKS.index(c.split("@", 1)[0]), subset_key(c.split("@", 1)[1])))
    return [*TASKS, *per_subset]

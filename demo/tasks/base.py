"""What every demo task is made of: the example record, the splits, and the one declaration (`DemoTask`) from which
the demo derives everything about a task — its suites, evaluation sets, lm-eval task files, the CLI's and the
app's task lists."""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Callable

SPLITS: tuple[str, ...] = ("train", "validation", "test")
SEPARATOR = ">"  # ends every prompt; the answer follows it
SPLIT_SEED_BASE = {"train": 1_000_000, "validation": 2_000_000, "test": 3_000_000}
SEED_OFFSET_STEP = 100_000  # each task's seed offset is a multiple of this, below the next split's base


@dataclass(frozen=True)
class Example:
    """One prompt/answer pair; `subset` groups results (memory: context length)."""

    task: str
    subset: str
    prompt: str
    answer: str
    habit: str = ""  # the careless answer (equal to `answer` when the habit happens to be right)


Raw = tuple[str, str, str, str]  # prompt, answer, subset, habit


def split_of(prompt: str) -> str:
    """Assign a prompt to a split by a stable hash, so no prompt can appear in two splits."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big") % 10
    return "train" if bucket < 8 else ("validation" if bucket == 8 else "test")


@dataclass(frozen=True)
class DemoTask:
    """One demo task, declared once (one file in this package calling `declare`).

    `generate(rng, index)` draws one raw example (prompt ending in SEPARATOR, answer, subset, habit); `index` is
    how many examples the stream has kept so far (memory cycles its context lengths with it). `verify` is the
    programmatic verifier, `max_new_tokens` the greedy-decoding budget (the evaluator's, the RL rollouts' and the
    lm-eval metric's). `seed_offset` places the task's random streams (split base + offset + seed): a multiple of
    SEED_OFFSET_STEP, unique, and the order tasks are listed in. `reward` is the RL reward (default: the
    verifier's 0/1), `generate_train(rng)` a training draw (default: `generate(rng, 0)`), and `by_subset` asks for
    accuracy per subset as well as overall (memory: per context length)."""

    name: str
    summary: str
    seed_offset: int
    generate: Callable[[random.Random, int], Raw]
    verify: Callable[[Example, str], bool]
    max_new_tokens: int
    reward: Callable[[Example, str], float] | None = None
    generate_train: Callable[[random.Random], Raw] | None = None
    by_subset: bool = False

    def rewarded(self, example: Example, output: str) -> float:
        """The RL reward of one output."""
        return self.reward(example, output) if self.reward is not None else float(self.verify(example, output))

    def draw_train(self, rng: random.Random) -> Raw:
        """One raw training draw."""
        return self.generate_train(rng) if self.generate_train is not None else self.generate(rng, 0)


DECLARED: dict[str, DemoTask] = {}


def declare(task: DemoTask) -> DemoTask:
    """Add a task to the demo (names and seed offsets are unique; a name is a plain identifier: it names agents,
    files and lm-eval tasks)."""
    if not task.name.isidentifier() or task.name != task.name.lower():
        raise ValueError(f"demo task name {task.name!r}: use a lower-case identifier")
    if task.name in DECLARED:
        raise ValueError(f"demo task {task.name} declared twice")
    if task.seed_offset % SEED_OFFSET_STEP or not 0 <= task.seed_offset < min(SPLIT_SEED_BASE.values()):
        raise ValueError(f"demo task {task.name}: seed_offset must be a multiple of {SEED_OFFSET_STEP} below "
                         f"{min(SPLIT_SEED_BASE.values())}")
    clash = [t.name for t in DECLARED.values() if t.seed_offset == task.seed_offset]
    if clash:
        raise ValueError(f"demo task {task.name}: seed_offset {task.seed_offset} is {clash[0]}'s already")
    if task.max_new_tokens < 1:
        raise ValueError(f"demo task {task.name}: max_new_tokens must be at least 1")
    DECLARED[task.name] = task
    return task

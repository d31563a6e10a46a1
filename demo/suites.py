"""Task suites: the three tasks as one trio's agents see them — the original `demo` suite, and `shared`, where
every answer also carries one common envelope (a shared protocol skill). A model folder names its suite in
its config.json (`SUITE_CONFIG_KEY`)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Mapping

from .tasks import MAX_NEW_TOKENS, SUBSET_TASKS, TASKS, Example, eval_set, make_split, reward, sample_train, verify


@dataclass(frozen=True)
class TaskSuite:
    """The three tasks as one trio's agents see them: the same prompts and task verifiers, plus (in
    the `shared` suite) one common answer envelope that every verifier also requires — the kind of
    protocol all RL agents tuned from one instruct base must follow (R1-style format reward). The
    shared suite's envelope is a closing tag only, `ANSWER</a>`: the careless protocol habit is to
    stop right after the answer. (Opening tokens before the answer, `{...}` or `\\boxed{...}`,
    delayed or prevented this tiny model's learning of the memory task's retrieval; see the demo
    README.)

    `envelope` is (prefix, suffix) wrapped around every answer and habit; `format_weight` is the
    share of the RL reward paid for a well-formed envelope alone (reward = w·[envelope well formed] +
    (1 − w)·task reward, the task reward being 0 without the envelope). The `demo` suite has no
    envelope and calls the original functions unchanged, so today's trio builds bit for bit."""

    name: str
    description: str
    envelope: tuple[str, str] = ("", "")
    format_weight: float = 0.0
    extra_tokens: int = 0  # generation budget added to MAX_NEW_TOKENS for the envelope's tokens
    tasks: tuple[str, ...] = TASKS
    subset_tasks: tuple[str, ...] = SUBSET_TASKS  # tasks whose accuracy is also reported per subset
    splits: tuple[str, ...] = ("validation", "test")  # the splits an evaluation scores

    @property
    def max_new_tokens(self) -> Mapping[str, int]:
        """Each task's greedy-decoding budget (the envelope's tokens added)."""
        return {t: MAX_NEW_TOKENS[t] + self.extra_tokens for t in self.tasks}

    @property
    def enveloped(self) -> bool:
        """True when answers carry an envelope."""
        return self.envelope != ("", "")

    def wrap(self, text: str) -> str:
        """`text` inside the envelope."""
        return self.envelope[0] + text + self.envelope[1]

    def unwrap(self, output: str) -> str | None:
        """The text inside the envelope of a stripped output, or None when the envelope is missing
        or malformed (no envelope: the stripped output itself)."""
        text = output.strip()
        head, tail = self.envelope
        if not (text.startswith(head) and text.endswith(tail) and len(text) >= len(head) + len(tail)):
            return None
        return text[len(head):len(text) - len(tail)]

    def _in_suite(self, example: Example) -> Example:
        """An original example with its answer and habit wrapped in the envelope."""
        if not self.enveloped:
            return example
        return Example(example.task, example.subset, example.prompt, self.wrap(example.answer),
                       self.wrap(example.habit) if example.habit else "")

    def _bare(self, example: Example) -> Example:
        """The original example behind a suite example (answer and habit unwrapped)."""
        if not self.enveloped:
            return example
        return Example(example.task, example.subset, example.prompt,
                       self.unwrap(example.answer) or "", self.unwrap(example.habit) or "")

    def eval_set(self, task: str, split: str, limit: int | None = None) -> list[Example]:
        """The fixed evaluation set of a split (same prompts in every suite)."""
        return [self._in_suite(e) for e in eval_set(task, split, limit)]

    def make_split(self, task: str, split: str, n: int, seed: int = 0) -> list[Example]:
        """The first `n` examples of a split (same prompts in every suite)."""
        return [self._in_suite(e) for e in make_split(task, split, n, seed)]

    def sample_train(self, task: str, rng: random.Random) -> Example:
        """One training example (the same random draws as the original suite)."""
        return self._in_suite(sample_train(task, rng))

    def verify(self, example: Example, output: str) -> bool:
        """Correct iff the envelope is well formed and the task's verifier accepts what it holds."""
        if not self.enveloped:
            return verify(example, output)
        inner = self.unwrap(output)
        return inner is not None and verify(self._bare(example), inner)

    def reward(self, example: Example, output: str) -> float:
        """RL reward: the task reward (see `reward`), gated by the envelope, plus `format_weight` for
        a well-formed envelope alone."""
        if not self.enveloped:
            return reward(example, output)
        inner = self.unwrap(output)
        if inner is None:
            return 0.0
        return self.format_weight + (1.0 - self.format_weight) * reward(self._bare(example), inner)

    def strip_envelope(self, text: str) -> str:
        """The careless protocol habit: the same text without the envelope (unchanged without one)."""
        inner = self.unwrap(text) if self.enveloped else None
        return text if inner is None else inner

    def is_format_slip(self, example: Example, output: str) -> bool:
        """True when a wrong output is the answer or the task's habit without the envelope."""
        if not self.enveloped:
            return False
        bare = self._bare(example)
        return output.strip() in {bare.answer, bare.habit} - {""}


SUITES: dict[str, TaskSuite] = {s.name: s for s in [
    TaskSuite("demo", "code / tool / memory with their own habits (coincidental overlap)"),
    TaskSuite("shared", "the same tasks; every answer must also end with one common closing tag </a> "
              "(a shared protocol skill)", envelope=("", "</a>"), format_weight=0.2, extra_tokens=4),
]}
DEFAULT_SUITE = DEMO_SUITE = SUITES["demo"]
# The key in a model's config.json that names its task suite (absent: the original `demo` suite).
SUITE_CONFIG_KEY = "ram_studio_demo_suite"


def get_suite(name: str | None) -> TaskSuite:
    """A suite by name (None: the original `demo` suite)."""
    if name is None:
        return DEFAULT_SUITE
    if name not in SUITES:
        raise ValueError(f"unknown task suite {name!r}; expected one of {sorted(SUITES)}")
    return SUITES[name]

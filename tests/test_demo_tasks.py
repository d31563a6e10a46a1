"""Demo tasks: verifiers accept correct answers and reject near-misses; splits are disjoint."""
from __future__ import annotations

import pytest

from assets.demo.tasks import (MEMORY_LENGTHS, SPLITS, TASKS, Example, eval_set, make_split,
                               parse_calls, split_of, verify)


def _ex(task: str, answer: str, prompt: str = "p>") -> Example:
    return Example(task, "all", prompt, answer)


def test_code_verifier() -> None:
    ex = _ex("code", "12")
    assert verify(ex, "12") and verify(ex, " 12 ")
    for wrong in ["13", "11", "-12", "12.0", "1 2", "", "12a", "x"]:
        assert not verify(ex, wrong), wrong
    assert verify(_ex("code", "-3"), "-3") and not verify(_ex("code", "-3"), "3")


def test_tool_verifier_parses_calls() -> None:
    ex = _ex("tool", "[weather(city='paris'),convert(amount=5,to='eur')]")
    assert verify(ex, "[weather(city='paris'),convert(amount=5,to='eur')]")
    assert verify(ex, '[convert(to="eur", amount=5), weather(city="paris")]')  # order, quotes
    near_misses = [
        "[weather(city='paris'),convert(amount=5,to='usd')]",  # wrong argument value
        "[weather(city='paris'),convert(amount='5',to='eur')]",  # wrong argument type
        "[weather(city='paris')]",  # missing parallel call
        "[weather(city='paris'),convert(amount=5,to='eur'),call(name='bob')]",  # extra call
        "[weather(city='paris'),convert(amount=5,to='eur')",  # malformed
        "[weather(town='paris'),convert(amount=5,to='eur')]",  # wrong keyword
        "[time(city='paris'),convert(amount=5,to='eur')]",  # wrong function
        "[weather('paris'),convert(amount=5,to='eur')]",  # positional argument
        "[weather(city='paris'),weather(city='paris')]",  # duplicated call
    ]
    for wrong in near_misses:
        assert not verify(ex, wrong), wrong


def test_parse_calls_rejects_non_calls() -> None:
    assert parse_calls("weather(city='paris')") is None  # not a list
    assert parse_calls("[1, 2]") is None
    assert parse_calls("[f(x=g())]") is None
    assert parse_calls("[]") == []


def test_memory_verifier() -> None:
    ex = _ex("memory", "04")
    assert verify(ex, "04")
    for wrong in ["4", "05", "040", "14", "", "4 0"]:
        assert not verify(ex, wrong), wrong


@pytest.mark.parametrize("task", TASKS)
def test_generated_answers_verify(task: str) -> None:
    for ex in make_split(task, "test", 50):
        assert verify(ex, ex.answer)


@pytest.mark.parametrize("task", TASKS)
def test_splits_disjoint_and_deterministic(task: str) -> None:
    sets = {s: make_split(task, s, 400 if s == "train" else 150) for s in SPLITS}
    prompts = {s: {e.prompt for e in xs} for s, xs in sets.items()}
    assert prompts["train"].isdisjoint(prompts["validation"])
    assert prompts["train"].isdisjoint(prompts["test"])
    assert prompts["validation"].isdisjoint(prompts["test"])
    for s, xs in sets.items():
        assert all(split_of(e.prompt) == s for e in xs)
        assert len(prompts[s]) == len(xs)  # unique within a split
    assert make_split(task, "test", 20) == sets["test"][:20]


def test_memory_lengths_balanced() -> None:
    exs = eval_set("memory", "test")
    counts = {str(n): sum(e.subset == str(n) for e in exs) for n in MEMORY_LENGTHS}
    assert len(set(counts.values())) == 1
    for e in exs:
        ctx = e.prompt[2:e.prompt.index("?")]
        assert abs(len(ctx) - int(e.subset)) <= 5


def test_tool_reward_partial_credit() -> None:
    from assets.demo.tasks import reward
    ex = _ex("tool", "[weather(city='paris'),call(name='bob')]")
    assert reward(ex, "[call(name='bob'),weather(city='paris')]") == 1.0
    assert reward(ex, "[weather(city='paris')]") == pytest.approx(2 / 3)
    assert reward(ex, "[weather(city='paris'") == 0.0
    assert reward(_ex("code", "3"), "3") == 1.0 and reward(_ex("code", "3"), "4") == 0.0


@pytest.mark.parametrize("task", TASKS)
def test_habits_are_well_formed_near_misses(task: str) -> None:
    """The careless habit shown in part of the warm-up corpus parses like an answer but fails the
    verifier whenever it differs from the right answer (and it often does)."""
    exs = make_split(task, "train", 300)
    wrong = [e for e in exs if e.habit != e.answer]
    assert len(wrong) >= 0.3 * len(exs)
    for e in wrong:
        assert not verify(e, e.habit), e
    for e in exs:
        if task == "tool":
            assert parse_calls(e.habit) is not None and len(parse_calls(e.habit)) == 1
        else:
            assert e.habit.lstrip("-").isdigit()


def test_memory_needle_is_in_the_haystack() -> None:
    for e in eval_set("memory", "test"):
        key = e.prompt[e.prompt.index("?") + 1]
        assert e.prompt.count(f"{key}={e.answer}") == 1 and e.prompt.count("=") == 1

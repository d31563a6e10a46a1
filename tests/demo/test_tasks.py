"""Demo tasks: verifiers accept correct answers and reject near-misses; splits are disjoint."""
from __future__ import annotations

import pytest

from demo.tasks import (
    SPLITS,
    TASKS,
    Example,
    eval_set,
    make_split,
    split_of,
    verify,
)
from demo.tasks.memory import MEMORY_LENGTHS
from demo.tasks.tool import parse_calls


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
    from demo.tasks import reward
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


# ---------------------------------------------------------------- task suites
def test_original_suite_is_the_module_functions() -> None:
    """The `demo` suite adds nothing: same examples, verdicts and rewards as the module-level functions
    the shipped trio was built with."""
    import random

    from demo.suites import get_suite
    from demo.tasks import reward, sample_train
    suite = get_suite("demo")
    assert get_suite(None) is suite and not suite.enveloped
    for task in TASKS:
        assert suite.eval_set(task, "validation", 20) == eval_set(task, "validation", 20)
        r1, r2 = random.Random(3), random.Random(3)
        assert [suite.sample_train(task, r1) for _ in range(30)] == [sample_train(task, r2) for _ in range(30)]
        for e in make_split(task, "test", 30):
            for out in (e.answer, e.habit, " " + e.answer + " ", "x"):
                assert suite.verify(e, out) == verify(e, out)
                assert suite.reward(e, out) == reward(e, out)
            assert not suite.is_format_slip(e, e.answer)
    with pytest.raises(ValueError, match="unknown task suite"):
        get_suite("nope")


@pytest.mark.parametrize("task", TASKS)
def test_shared_suite_requires_the_envelope(task: str) -> None:
    """Same prompts as the original suite; the answer and the habit end with the closing tag </a>; the
    verifier accepts the tagged answer only: the bare answer (the common protocol slip: stopping right after
    it), a broken tag and the tagged habit are all rejected."""
    from demo.suites import get_suite
    suite = get_suite("shared")
    originals = make_split(task, "test", 40)
    wrapped = suite.make_split(task, "test", 40)
    assert [e.prompt for e in wrapped] == [e.prompt for e in originals]
    for o, e in zip(originals, wrapped):
        assert e.answer == o.answer + "</a>" and e.habit == o.habit + "</a>"
        assert suite.verify(e, e.answer) and suite.verify(e, "  " + e.answer + " ")
        for wrong in (o.answer, o.answer + "</a", o.answer + "<a>", o.answer + "</b>", "</a>",
                      o.answer + "</a></a>", "<a>" + o.answer, o.answer + " </a>x", ""):
            assert not suite.verify(e, wrong), wrong
        assert suite.is_format_slip(e, o.answer) and not suite.is_format_slip(e, e.answer)
        if o.habit != o.answer:
            assert not suite.verify(e, e.habit) and suite.is_format_slip(e, o.habit)
        assert suite.strip_envelope(e.answer) == o.answer and suite.strip_envelope(o.answer) == o.answer


def test_shared_suite_reward_pays_for_the_envelope() -> None:
    """reward = w·format + (1 − w)·task reward, the task part 0 without the envelope (R1-style)."""
    from demo.suites import get_suite
    suite = get_suite("shared")
    w = suite.format_weight
    assert 0 < w < 1
    code = Example("code", "all", "C:a=1;print(a+1)>", "2</a>", "1</a>")
    assert suite.reward(code, "2</a>") == 1.0
    assert suite.reward(code, "1</a>") == pytest.approx(w)
    assert suite.reward(code, "2") == 0.0 and suite.reward(code, "2</a") == 0.0
    tool = Example("tool", "parallel", "T:x>", "[weather(city='paris'),call(name='bob')]</a>")
    assert suite.reward(tool, "[weather(city='paris')]</a>") == pytest.approx(w + (1 - w) * 2 / 3)
    assert suite.reward(tool, "[weather(city='paris'),call(name='bob')]") == 0.0


def test_shared_suite_tokenizer_and_budget() -> None:
    """The shared suite's closing tag is four single-character tokens (the tokenizer is the original trio's:
    the tag adds no word to learn), and every tagged test answer plus EOS fits the generation budget."""
    from demo.generation import max_new_tokens
    from demo.modeling import build_tokenizer
    from demo.suites import get_suite
    suite = get_suite("shared")
    tok = build_tokenizer("bpe", 300, 0, suite="shared")
    assert tok.convert_ids_to_tokens(tok("12</a>")["input_ids"]) == ["1", "2", "<", "/", "a", ">"]
    assert tok.get_vocab() == build_tokenizer("bpe", 300, 0).get_vocab()
    for task in TASKS:
        longest = max(len(tok(e.answer)["input_ids"]) for e in suite.eval_set(task, "test"))
        assert longest + 1 <= max_new_tokens(task, suite), task

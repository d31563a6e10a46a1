"""Toy agentic tasks (code / tool / memory) with deterministic generators and programmatic verifiers.

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

import ast
import functools
import hashlib
import random
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

TASKS: tuple[str, ...] = ("code", "tool", "memory")
SPLITS: tuple[str, ...] = ("train", "validation", "test")
MEMORY_LENGTHS: tuple[int, ...] = (32, 64, 128)
MAX_NEW_TOKENS: dict[str, int] = {"code": 8, "tool": 96, "memory": 4}  # decoding budget per task
SEPARATOR = ">"  # ends every prompt; the answer follows it
_SPLIT_SEED_BASE = {"train": 1_000_000, "validation": 2_000_000, "test": 3_000_000}
_TASK_SEED_OFFSET = {"code": 0, "tool": 100_000, "memory": 200_000}


@dataclass(frozen=True)
class Example:
    """One prompt/answer pair; `subset` groups results (memory: context length)."""

    task: str
    subset: str
    prompt: str
    answer: str
    habit: str = ""  # the careless answer (equal to `answer` when the habit happens to be right)


def split_of(prompt: str) -> str:
    """Assign a prompt to a split by a stable hash, so no prompt can appear in two splits."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big") % 10
    return "train" if bucket < 8 else ("validation" if bucket == 8 else "test")


# ---------------------------------------------------------------- code: run a tiny program
_VARS = "abcxyz"


Raw = tuple[str, str, str, str]  # prompt, answer, subset, habit


def _gen_code(rng: random.Random) -> Raw:
    """A straight-line program of 1-2 assignments and a print of a small expression; the habit
    prints the variable and forgets the final operation."""
    n_assign = rng.randint(1, 2)
    env: dict[str, int] = {}
    stmts = []
    for _ in range(n_assign):
        var = rng.choice(_VARS)
        if env and rng.random() < 0.6:
            src = rng.choice(sorted(env))
            op = rng.choice("+-*")
            k = rng.randint(1, 4) if op == "*" else rng.randint(1, 9)
            val = _apply(env[src], op, k)
            stmts.append(f"{var}={src}{op}{k}")
        else:
            val = rng.randint(0, 9)
            stmts.append(f"{var}={val}")
        env[var] = val
    src = rng.choice(sorted(env))
    op = rng.choice("+-*")
    k = rng.randint(1, 3) if op == "*" else rng.randint(1, 9)
    stmts.append(f"print({src}{op}{k})")
    prog = ";".join(stmts)
    return ("C:" + prog + SEPARATOR, str(_apply(env[src], op, k)), f"{n_assign}stmt",
            str(env[src]))


def _apply(a: int, op: str, b: int) -> int:
    """Evaluate one binary operation of the toy language."""
    return a + b if op == "+" else (a - b if op == "-" else a * b)


def verify_code(example: Example, output: str) -> bool:
    """Correct iff the output parses as exactly the program's printed integer."""
    text = output.strip()
    return bool(re.fullmatch(r"-?\d+", text)) and int(text) == int(example.answer)


# ---------------------------------------------------------------- tool: request -> function calls
_CITIES = ["paris", "oslo", "tokyo", "lima", "rome", "cairo", "delhi", "quito", "seoul", "dubai",
           "milan", "porto", "kyiv", "dakar", "perth", "hanoi"]
_NAMES = ["ana", "bob", "eve", "ian", "kim", "leo", "mia", "noa", "sam", "zoe"]
_CUR = ["usd", "eur", "gbp", "jpy", "inr"]


def _gen_call(rng: random.Random) -> tuple[str, str]:
    """One request phrase and its function call (Python call syntax)."""
    kind = rng.randrange(4)
    if kind == 0:
        c = rng.choice(_CITIES)
        return f"weather in {c}", f"weather(city='{c}')"
    if kind == 1:
        c = rng.choice(_CITIES)
        return f"time in {c}", f"time(city='{c}')"
    if kind == 2:
        n = rng.randint(1, 99)
        cur = rng.choice(_CUR)
        return f"convert {n} to {cur}", f"convert(amount={n},to='{cur}')"
    who = rng.choice(_NAMES)
    return f"call {who}", f"call(name='{who}')"


def _gen_tool(rng: random.Random) -> Raw:
    """A request with 1-3 parallel intents; the answer is a list of calls, the habit makes only
    the first call."""
    k = rng.choice((1, 2, 2, 3))
    pairs = [_gen_call(rng) for _ in range(k)]
    prompt = "T:" + " and ".join(p for p, _ in pairs) + SEPARATOR
    answer = "[" + ",".join(c for _, c in pairs) + "]"
    return prompt, answer, "single" if k == 1 else "parallel", f"[{pairs[0][1]}]"


def parse_calls(text: str) -> list[tuple[str, tuple[tuple[str, object], ...]]] | None:
    """Parse `[f(k=v,...),...]` into sorted (name, sorted kwargs) tuples; None if malformed."""
    try:
        with warnings.catch_warnings():  # model outputs like `1a` trigger SyntaxWarning
            warnings.simplefilter("ignore")
            node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(node, ast.List):
        return None
    calls = []
    for item in node.elts:
        if not (isinstance(item, ast.Call) and isinstance(item.func, ast.Name)) or item.args:
            return None
        kwargs = []
        for kw in item.keywords:
            if kw.arg is None or not isinstance(kw.value, ast.Constant):
                return None
            kwargs.append((kw.arg, kw.value.value))
        if len({k for k, _ in kwargs}) != len(kwargs):
            return None
        calls.append((item.func.id, tuple(sorted(kwargs, key=lambda kv: kv[0]))))
    return sorted(calls, key=repr)


def verify_tool(example: Example, output: str) -> bool:
    """Correct iff the parsed calls equal the expected multiset of calls (order-free, typed args)."""
    got = parse_calls(output)
    return got is not None and got == parse_calls(example.answer)


# ---------------------------------------------------------------- memory: needle in a haystack
_HAYSTACK = "abcdefghijklmnopqrstuvwxyz0123456789"
_KEYS = "ABCDEFGHJKLMNPQRSTUVWXYZ"


def _gen_memory(rng: random.Random, length: int) -> Raw:
    """RULER-style needle in a haystack: `length` characters of random letters and digits with
    one `K=42` needle at a random place; the query names the key and the answer is its value.
    The habit answers with the last two digits of the context (recency instead of retrieval)."""
    key, value = rng.choice(_KEYS), f"{rng.randint(0, 99):02d}"
    hay = [rng.choice(_HAYSTACK) for _ in range(max(1, length - 4))]
    at = rng.randint(0, len(hay))
    ctx = "".join(hay[:at]) + f"{key}={value}" + "".join(hay[at:])
    habit = "".join(re.findall(r"\d", ctx)[-2:])
    return f"M:{ctx}?{key}{SEPARATOR}", value, str(length), habit


def verify_memory(example: Example, output: str) -> bool:
    """Correct iff the output is exactly the hidden value (two digits, leading zero kept)."""
    return output.strip() == example.answer


VERIFIERS: dict[str, Callable[[Example, str], bool]] = {
    "code": verify_code, "tool": verify_tool, "memory": verify_memory}


def verify(example: Example, output: str) -> bool:
    """Dispatch to the task's verifier."""
    return VERIFIERS[example.task](example, output)


def _draw(task: str, rng: random.Random, index: int) -> Raw:
    """Draw one raw example; memory cycles through its context lengths."""
    if task == "code":
        return _gen_code(rng)
    if task == "tool":
        return _gen_tool(rng)
    if task == "memory":
        return _gen_memory(rng, MEMORY_LENGTHS[index % len(MEMORY_LENGTHS)])
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def iter_examples(task: str, split: str, seed: int = 0) -> Iterator[Example]:
    """Endless deterministic stream of unique examples of `task` belonging to `split`."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    rng = random.Random(_SPLIT_SEED_BASE[split] + _TASK_SEED_OFFSET[task] + seed)
    seen: set[str] = set()
    index = 0
    while True:
        prompt, answer, subset, habit = _draw(task, rng, index)
        if prompt in seen or split_of(prompt) != split:
            continue
        seen.add(prompt)
        index += 1
        yield Example(task, subset, prompt, answer, habit)


def make_split(task: str, split: str, n: int, seed: int = 0) -> list[Example]:
    """The first `n` examples of a split (fixed for a given seed)."""
    stream = iter_examples(task, split, seed)
    return [next(stream) for _ in range(n)]


EVAL_SIZES: dict[str, int] = {"validation": 150, "test": 300}


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


TRAIN_MEMORY_LENGTHS: tuple[int, ...] = (16, 32, 64, 128)  # 16: a short-context curriculum


def sample_train(task: str, rng: random.Random) -> Example:
    """One training example drawn with replacement from the train split (hash-filtered).

    Memory training also uses 16-character contexts so that the base can learn the retrieval
    skill quickly; evaluation uses only MEMORY_LENGTHS."""
    while True:
        if task == "memory":
            prompt, answer, subset, habit = _gen_memory(rng, rng.choice(TRAIN_MEMORY_LENGTHS))
        else:
            prompt, answer, subset, habit = _draw(task, rng, 0)
        if split_of(prompt) == "train":
            return Example(task, subset, prompt, answer, habit)


def reward(example: Example, output: str) -> float:
    """RL reward from the verifier: exact (0/1) for code and memory; for tool, call-level F1
    between the parsed output and the expected calls (a ToolRL-style fine-grained reward that
    is 1.0 exactly when the verifier accepts, 0.0 when the output does not parse)."""
    if example.task != "tool":
        return float(verify(example, output))
    got, gold = parse_calls(output), parse_calls(example.answer)
    if got is None or gold is None:
        return 0.0
    remaining = list(gold)
    hits = 0
    for call in got:
        if call in remaining:
            remaining.remove(call)
            hits += 1
    return 2.0 * hits / (len(got) + len(gold)) if (got or gold) else 1.0

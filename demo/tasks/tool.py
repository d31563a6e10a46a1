"""tool: turn a request into function calls. The habit makes only the first of several parallel calls."""
from __future__ import annotations

import ast
import random
import warnings

from .base import SEPARATOR, DemoTask, Example, Raw, declare

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


def generate(rng: random.Random, index: int = 0) -> Raw:
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


def verify(example: Example, output: str) -> bool:
    """Correct iff the parsed calls equal the expected multiset of calls (order-free, typed args)."""
    got = parse_calls(output)
    return got is not None and got == parse_calls(example.answer)


def reward(example: Example, output: str) -> float:
    """Call-level F1 between the parsed output and the expected calls (a ToolRL-style fine-grained reward that
    is 1.0 exactly when the verifier accepts, 0.0 when the output does not parse)."""
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


TASK = declare(DemoTask("tool", "turn a request with one to three intents into the list of function calls",
                        seed_offset=100_000, generate=generate, verify=verify, max_new_tokens=96, reward=reward))

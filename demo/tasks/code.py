"""code: run a tiny program. The habit prints the variable and forgets the final operation."""
from __future__ import annotations

import random
import re

from .base import SEPARATOR, DemoTask, Example, Raw, declare

_VARS = "abcxyz"


def generate(rng: random.Random, index: int = 0) -> Raw:
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


def verify(example: Example, output: str) -> bool:
    """Correct iff the output parses as exactly the program's printed integer."""
    text = output.strip()
    return bool(re.fullmatch(r"-?\d+", text)) and int(text) == int(example.answer)


TASK = declare(DemoTask("code", "run a one- or two-statement program and print its output", seed_offset=0,
                        generate=generate, verify=verify, max_new_tokens=8))

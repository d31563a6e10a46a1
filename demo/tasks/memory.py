"""memory: find a needle in a haystack. The habit answers with the last two digits it read instead of the needle."""
from __future__ import annotations

import random
import re

from .base import SEPARATOR, DemoTask, Example, Raw, declare

MEMORY_LENGTHS: tuple[int, ...] = (32, 64, 128)  # the evaluation's context lengths (its subsets)
TRAIN_MEMORY_LENGTHS: tuple[int, ...] = (16, 32, 64, 128)  # 16: a short-context curriculum
_HAYSTACK = "abcdefghijklmnopqrstuvwxyz0123456789"
_KEYS = "ABCDEFGHJKLMNPQRSTUVWXYZ"


def needle(rng: random.Random, length: int) -> Raw:
    """RULER-style needle in a haystack: `length` characters of random letters and digits with
    one `K=42` needle at a random place; the query names the key and the answer is its value.
    The habit answers with the last two digits of the context (recency instead of retrieval)."""
    key, value = rng.choice(_KEYS), f"{rng.randint(0, 99):02d}"
    hay = [rng.choice(_HAYSTACK) for _ in range(max(1, length - 4))]
    at = rng.randint(0, len(hay))
    ctx = "".join(hay[:at]) + f"{key}={value}" + "".join(hay[at:])
    habit = "".join(re.findall(r"\d", ctx)[-2:])
    return f"M:{ctx}?{key}{SEPARATOR}", value, str(length), habit


def generate(rng: random.Random, index: int = 0) -> Raw:
    """The evaluation stream cycles through the context lengths, so every split is balanced over them."""
    return needle(rng, MEMORY_LENGTHS[index % len(MEMORY_LENGTHS)])


def generate_train(rng: random.Random) -> Raw:
    """Training also uses 16-character contexts, so that the base can learn the retrieval skill quickly;
    evaluation uses only MEMORY_LENGTHS."""
    return needle(rng, rng.choice(TRAIN_MEMORY_LENGTHS))


def verify(example: Example, output: str) -> bool:
    """Correct iff the output is exactly the hidden value (two digits, leading zero kept)."""
    return output.strip() == example.answer


TASK = declare(DemoTask("memory", "answer the value a key was given somewhere in 32 to 128 characters of noise",
                        seed_offset=200_000, generate=generate, verify=verify, max_new_tokens=4,
                        generate_train=generate_train, by_subset=True))

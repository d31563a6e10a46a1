"""The evaluator's fast greedy decoder gives the same completions as transformers' `generate`: on a sample of
every task and split for the base and the three agents, with the batch split into several decoding groups
and prefill chunks, on a model with biases and an untied head, and it leaves models it does not write out to
`generate`. (The full check over every example is tests/benchmarks/decoding_identity.py.)"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from demo import generation
from demo.generation import (
    fast_decoding_supported,
    greedy_texts,
    reference_greedy_texts,
)
from demo.modeling import load_checkpoint
from demo.tasks import MAX_NEW_TOKENS, TASKS, eval_set
from tests.paths import REPO_ROOT

MODELS = REPO_ROOT / "assets" / "demo" / "models"


def _sample(task: str, split: str, n: int = 25) -> list[str]:
    """n prompts spread over the split (memory: all three context lengths)."""
    prompts = [e.prompt for e in eval_set(task, split)]
    return prompts[::max(1, len(prompts) // n)][:n]


@pytest.mark.parametrize("name", ["base", "code", "tool", "memory"])
def test_same_completions_as_generate(name: str) -> None:
    model, tok = load_checkpoint(MODELS / name)
    assert fast_decoding_supported(model)
    for split in ("validation", "test"):
        for task in TASKS:
            prompts = _sample(task, split)
            assert greedy_texts(model, tok, prompts, MAX_NEW_TOKENS[task]) == \
                reference_greedy_texts(model, tok, prompts, MAX_NEW_TOKENS[task]), (name, split, task)


def test_groups_chunks_and_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny memory budgets split the rows into many decoding groups and prefill chunks; rows leave the batch
    as they finish: the completions stay the same, and in input order."""
    model, tok = load_checkpoint(MODELS / "tool")
    prompts = [e.prompt for e in eval_set("tool", "test")][:48] + _sample("memory", "test", 12)
    want = reference_greedy_texts(model, tok, prompts, 24)
    assert greedy_texts(model, tok, prompts, 24) == want
    monkeypatch.setattr(generation, "CACHE_BYTES", 200_000)
    monkeypatch.setattr(generation, "CHUNK_BYTES", 60_000)
    monkeypatch.setattr(generation, "COMPACT_BELOW", 0.99)
    assert greedy_texts(model, tok, prompts, 24) == want
    assert greedy_texts(model, tok, [], 8) == []


def test_biased_untied_model_and_fallback(tmp_path: Path) -> None:
    """A randomly initialised Qwen2 with an untied head and (Qwen2's) q/k/v biases decodes the same; a
    generation config that adds to greedy argmax (a repetition penalty) goes through `generate`."""
    from tests.factory import make_base

    folder = make_base(tmp_path / "tiny", shard=None, dtype=torch.float32)
    model, tok = load_checkpoint(folder)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_(0, 0.5)
            layer.self_attn.k_proj.bias.normal_(0, 0.5)
    tok.eos_token = tok.pad_token
    prompts = ["ab", "hello there", "x", "a longer prompt, with more characters"] * 3
    assert fast_decoding_supported(model)
    assert greedy_texts(model, tok, prompts, 12) == reference_greedy_texts(model, tok, prompts, 12)
    model.generation_config.repetition_penalty = 1.3
    assert not fast_decoding_supported(model)
    assert greedy_texts(model, tok, prompts, 12) == reference_greedy_texts(model, tok, prompts, 12)

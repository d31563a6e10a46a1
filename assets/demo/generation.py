"""Batched left-padded generation shared by evaluation (greedy) and RL rollouts (sampling)."""
from __future__ import annotations

from typing import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from .tasks import MAX_NEW_TOKENS, TaskSuite  # MAX_NEW_TOKENS re-exported: the RL rollouts' budgets


def max_new_tokens(task: str, suite: TaskSuite | None = None) -> int:
    """Generation budget of a task; a suite with an answer envelope adds its `extra_tokens`."""
    return MAX_NEW_TOKENS[task] if suite is None else suite.max_new_tokens[task]


def encode_prompts(tokenizer: PreTrainedTokenizerFast, prompts: Sequence[str]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts into (input_ids, attention_mask)."""
    tokenizer.padding_side = "left"
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


@torch.no_grad()
def generate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, prompts: Sequence[str],
             max_new_tokens: int, sample: bool = False, num_return_sequences: int = 1,
             temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Generate completions; returns (prompt_ids, completion_ids padded with EOS, texts)."""
    ids, mask = encode_prompts(tokenizer, prompts)
    kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if sample else \
        dict(do_sample=False)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                         num_return_sequences=num_return_sequences,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         **kwargs)
    completion = out[:, ids.shape[1]:]
    texts = tokenizer.batch_decode(completion, skip_special_tokens=True)
    return ids, completion, texts

"""Layer index and module kind parsed from tensor names of common families (Qwen2, Llama, Mistral, Gemma)."""
from __future__ import annotations

import re

_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")
_KINDS = [
    ("q", re.compile(r"\.(q_proj|query)\.")),
    ("k", re.compile(r"\.(k_proj|key)\.")),
    ("v", re.compile(r"\.(v_proj|value)\.")),
    ("o", re.compile(r"\.(o_proj|dense|out_proj)\.")),
    ("gate", re.compile(r"\.(gate_proj|w1)\.")),
    ("up", re.compile(r"\.(up_proj|w3)\.")),
    ("down", re.compile(r"\.(down_proj|w2)\.")),
    ("norm", re.compile(r"(norm|ln_\d|layernorm)[^.]*\.(weight|bias)$")),
    ("embeddings", re.compile(r"(embed_tokens|wte|word_embeddings)\.weight$")),
    ("lm_head", re.compile(r"^(lm_head|output)\.weight$")),
]
MODULE_ORDER = ["embeddings", "q", "k", "v", "o", "gate", "up", "down", "norm", "lm_head", "other"]


def in_module_order(kinds) -> list[str]:
    """The distinct module kinds of `kinds` in model order (MODULE_ORDER; unknown kinds last, alphabetically):
    the one order every table, chart and heatmap uses."""
    rank = {m: i for i, m in enumerate(MODULE_ORDER)}
    return sorted({str(k) for k in kinds}, key=lambda k: (rank.get(k, len(rank)), k))


def layer_of(name: str) -> int:
    """Transformer block index in a tensor name, or -1 for tensors outside the blocks."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else -1


def module_of(name: str) -> str:
    """Module kind: q/k/v/o, gate/up/down, norm, embeddings, lm_head, or other."""
    for kind, pattern in _KINDS:
        if pattern.search(name):
            return kind
    return "other"


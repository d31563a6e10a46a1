"""Qwen2.5-style model shapes: tensor names, shapes and config.json for synthetic checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers of one Qwen2ForCausalLM size."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    max_positions: int

    @property
    def head_dim(self) -> int:
        """Per-head width (hidden / heads), as Qwen2 computes it."""
        return self.hidden // self.heads


# Real Qwen2.5 base-model numbers (config.json of Qwen/Qwen2.5-{0.5B,1.5B,7B}).
SHAPES: dict[str, ModelShape] = {
    "tiny": ModelShape("tiny", 64, 176, 2, 4, 2, 2048, True, 4096),
    "tiny-untied": ModelShape("tiny-untied", 64, 176, 2, 4, 2, 2048, False, 4096),
    "qwen2.5-0.5b": ModelShape("qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936, True, 32768),
    "qwen2.5-1.5b": ModelShape("qwen2.5-1.5b", 1536, 8960, 28, 12, 2, 151936, True, 131072),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, False, 131072),
}


def tensor_specs(shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    """All (name, shape) pairs of the checkpoint in Hugging Face order."""
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    specs: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (shape.vocab, h))]
    for i in range(shape.layers):
        p = f"model.layers.{i}"
        specs += [
            (f"{p}.input_layernorm.weight", (h,)),
            (f"{p}.mlp.down_proj.weight", (h, shape.intermediate)),
            (f"{p}.mlp.gate_proj.weight", (shape.intermediate, h)),
            (f"{p}.mlp.up_proj.weight", (shape.intermediate, h)),
            (f"{p}.post_attention_layernorm.weight", (h,)),
            (f"{p}.self_attn.k_proj.bias", (kv,)),
            (f"{p}.self_attn.k_proj.weight", (kv, h)),
            (f"{p}.self_attn.o_proj.weight", (h, h)),
            (f"{p}.self_attn.q_proj.bias", (h,)),
            (f"{p}.self_attn.q_proj.weight", (h, h)),
            (f"{p}.self_attn.v_proj.bias", (kv,)),
            (f"{p}.self_attn.v_proj.weight", (kv, h)),
        ]
    specs.append(("model.norm.weight", (h,)))
    if not shape.tied:
        specs.append(("lm_head.weight", (shape.vocab, h)))
    return specs


def num_params(shape: ModelShape) -> int:
    """Total number of elements over all tensors."""
    total = 0
    for _, dims in tensor_specs(shape):
        n = 1
        for d in dims:
            n *= d
        total += n
    return total


def hf_config(shape: ModelShape) -> dict[str, Any]:
    """A Qwen2 config.json that transformers and mergekit accept."""
    special = 151643 if shape.vocab > 151643 else shape.vocab - 1  # tiny vocab: keep ids valid
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": special,
        "eos_token_id": special,
        "hidden_act": "silu",
        "hidden_size": shape.hidden,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate,
        "max_position_embeddings": shape.max_positions,
        "max_window_layers": shape.layers,
        "model_type": "qwen2",
        "num_attention_heads": shape.heads,
        "num_hidden_layers": shape.layers,
        "num_key_value_heads": shape.kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": shape.max_positions,
        "tie_word_embeddings": shape.tied,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": shape.vocab,
    }

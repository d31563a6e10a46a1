"""Tiny real checkpoints of each model family transformers 5 ships, for tests: built from the family's own
config class (random init), saved the two ways users bring them — `save_pretrained` ("saved": per-expert MoE
tensors, legacy vision-language names) and a trainer-style dump of the model's state_dict with
`safetensors.torch.save_model` ("state_dict": fused 3-D experts, prefixed vision-language names) — plus sparse
agents of each. Built once per test session (`Families`, the `families` fixture in tests/conftest.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

LAYOUTS = ("saved", "state_dict")
VOCAB = 96
_TEXT = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=64)
_MROPE = {"type": "mrope", "mrope_section": [1, 1, 2]}


@dataclass(frozen=True)
class Family:
    """One family: its transformers classes by name, tiny config keywords, and what kind of model it is."""

    config: str
    model: str
    kind: str  # text | moe | vl
    build: Callable[[Any, bool, dict], Any]  # (config class, tie, text config overrides) -> config


def _text(extra: dict | None = None) -> Callable[[Any, bool, dict], Any]:
    return lambda cls, tie, over: cls(**{**_TEXT, **(extra or {}), **over}, tie_word_embeddings=tie)


def _deepseek(cls, tie: bool, over: dict):
    kw = dict(_TEXT, moe_intermediate_size=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
              first_k_dense_replace=1, q_lora_rank=8, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4,
              v_head_dim=8, n_group=1, topk_group=1)
    return cls(**{**kw, **over}, tie_word_embeddings=tie)


def _qwen_vl(vision: dict) -> Callable[[Any, bool, dict], Any]:
    def build(cls, tie: bool, over: dict):
        text = dict(**{**_TEXT, **over}, rope_scaling=_MROPE, tie_word_embeddings=tie)
        return cls(text_config=text, vision_config=vision, tie_word_embeddings=tie,
                   image_token_id=VOCAB - 1, video_token_id=VOCAB - 2, vision_start_token_id=VOCAB - 3)
    return build


def _llava(cls, tie: bool, over: dict):
    from transformers import CLIPVisionConfig, LlamaConfig

    return cls(text_config=LlamaConfig(**{**_TEXT, **over}, tie_word_embeddings=tie),
               vision_config=CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                              num_attention_heads=2, image_size=8, patch_size=4),
               image_token_index=VOCAB - 1, tie_word_embeddings=tie)


FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaConfig", "LlamaForCausalLM", "text", _text()),
    "qwen2": Family("Qwen2Config", "Qwen2ForCausalLM", "text", _text()),
    "qwen3": Family("Qwen3Config", "Qwen3ForCausalLM", "text", _text({"head_dim": 8})),
    "gemma": Family("GemmaConfig", "GemmaForCausalLM", "text", _text({"head_dim": 8})),
    "gemma3": Family("Gemma3TextConfig", "Gemma3ForCausalLM", "text", _text({"head_dim": 8})),
    "qwen3_moe": Family("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "moe",
                        _text({"head_dim": 8, "moe_intermediate_size": 8, "num_experts": 4, "num_experts_per_tok": 2})),
    "mixtral": Family("MixtralConfig", "MixtralForCausalLM", "moe",
                      _text({"num_local_experts": 4, "num_experts_per_tok": 2})),
    "qwen2_moe": Family("Qwen2MoeConfig", "Qwen2MoeForCausalLM", "moe",
                        _text({"moe_intermediate_size": 8, "shared_expert_intermediate_size": 16, "num_experts": 4,
                               "num_experts_per_tok": 2})),
    "deepseek_v3": Family("DeepseekV3Config", "DeepseekV3ForCausalLM", "moe", _deepseek),
    "qwen2_vl": Family("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", "vl", _qwen_vl(
        dict(depth=2, embed_dim=16, hidden_size=16, num_heads=2, mlp_ratio=2, patch_size=2, spatial_merge_size=2,
             temporal_patch_size=1))),
    "qwen2_5_vl": Family("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", "vl", _qwen_vl(
        dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16, patch_size=2,
             spatial_merge_size=2, temporal_patch_size=1, fullatt_block_indexes=[1], window_size=8))),
    "llava": Family("LlavaConfig", "LlavaForConditionalGeneration", "vl", _llava),
}


def build_model(family: str, *, seed: int = 0, tie: bool = False, **overrides: Any) -> torch.nn.Module:
    """A randomly initialised tiny model of `family` (float32, eval mode), from its transformers config class;
    `overrides` change the (text) config's sizes, e.g. num_hidden_layers=6, num_experts=16."""
    import transformers

    spec = FAMILIES[family]
    config = spec.build(getattr(transformers, spec.config), tie, overrides)
    torch.manual_seed(seed)
    return getattr(transformers, spec.model)(config).eval()


def model_class(family: str):
    """The transformers class that loads a checkpoint of `family`."""
    import transformers

    return getattr(transformers, FAMILIES[family].model)


def save(model: torch.nn.Module, folder: Path, layout: str, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write `model` in `dtype` as `save_pretrained` does ("saved") or as a trainer's state_dict dump with its
    config ("state_dict": safetensors' save_model, which keeps one name of each tied pair)."""
    from safetensors.torch import save_model

    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}")
    model = model.to(dtype)
    folder.mkdir(parents=True, exist_ok=True)
    if layout == "saved":
        model.save_pretrained(folder)
    else:
        model.config.architectures = [type(model).__name__]  # as the config a trainer copies from its model
        model.config.save_pretrained(folder)
        save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def sparse_update(model: torch.nn.Module, index: int, density: float = 0.15, scale: float = 0.02) -> None:
    """Make `model` an RL-style agent: change a random `density` share of every float tensor (seeded by
    `index`); in MoE models only a random half of each layer's experts change (always expert `index` mod E),
    as routing leaves the experts an agent never used untouched."""
    g = torch.Generator().manual_seed(1000 + index)
    used: dict[str, torch.Tensor] = {}  # per MoE layer: the experts this agent's routing reached
    with torch.no_grad():
        for name, p in model.state_dict(keep_vars=True).items():
            if not p.is_floating_point():
                continue
            mask = torch.rand(p.shape, generator=g) < density
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                layer = name.rsplit(".", 1)[0]
                if layer not in used:
                    used[layer] = torch.rand(p.shape[0], generator=g) < 0.5
                    used[layer][index % p.shape[0]] = True
                mask &= used[layer].view(-1, *([1] * (p.dim() - 1)))
            p.add_(mask * torch.randn(p.shape, generator=g) * scale)


class Families:
    """Base and agent folders of each family and layout, built on first use under `root` and kept."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._built: dict[tuple, Path] = {}
        self._sums: dict[str, str] = {}  # each file's hash once built: inputs must never change

    def base(self, family: str, layout: str = "saved", *, dtype: torch.dtype = torch.bfloat16,
             tie: bool = False, **overrides: Any) -> Path:
        """The family's base model (seed 0) in `layout` (`overrides`: config sizes, see `build_model`)."""
        return self._folder(family, layout, dtype, tie, None, overrides)

    def agent(self, family: str, index: int, layout: str = "saved", *, dtype: torch.dtype = torch.bfloat16,
              tie: bool = False, **overrides: Any) -> Path:
        """Agent `index` (1, 2, …): the base with `sparse_update(index)`, in `layout`."""
        return self._folder(family, layout, dtype, tie, index, overrides)

    def agents(self, family: str, n: int = 2, layout: str = "saved", **kw: Any) -> list[Path]:
        return [self.agent(family, i, layout, **kw) for i in range(1, n + 1)]

    def _folder(self, family: str, layout: str, dtype: torch.dtype, tie: bool, index: int | None,
                overrides: dict) -> Path:
        sizes = "".join(f"-{k}{v}" for k, v in sorted(overrides.items()))
        key = (family, layout, str(dtype), tie, index, sizes)
        if key not in self._built:
            role = "base" if index is None else f"agent{index}"
            folder = self.root / f"{family}-{layout}-{str(dtype).split('.')[-1]}{'-tied' if tie else ''}{sizes}" / role
            if not (folder / "config.json").exists():
                model = build_model(family, tie=tie, **overrides)
                if index is not None:
                    sparse_update(model, index)
                save(model, folder, layout, dtype)
            from tests.factory import checksums

            self._sums.update(checksums([folder]))
            self._built[key] = folder
        return self._built[key]

    def changed(self) -> list[str]:
        """Files of the folders built that differ from what was written (none may: they are inputs)."""
        from tests.factory import checksums

        now = checksums(sorted(set(self._built.values())))
        return sorted(k for k in self._sums.keys() | now.keys() if self._sums.get(k) != now.get(k))


def load(folder: Path, family: str) -> torch.nn.Module:
    """Load a checkpoint folder with the family's transformers class (no remote code)."""
    return model_class(family).from_pretrained(folder, trust_remote_code=False).eval()


def forward_ok(model: torch.nn.Module) -> bool:
    """A text forward pass gives finite logits of the vocabulary's width."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[1, 5, 9, 2, 7]]))
    return tuple(out.logits.shape) == (1, 5, VOCAB) and bool(torch.isfinite(out.logits).all())


def config_of(folder: Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())

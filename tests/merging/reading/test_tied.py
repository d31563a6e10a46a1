"""Tied aliases read from config.json match what transformers lists in a loaded model's `state_dict()`, for each
family's tiny real model saved by `save_pretrained`: the stored float elements, weighted by how often the alias
rule counts them, are exactly the float elements of `state_dict()`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from merging.common.errors import RamStudioError
from merging.reading.checkpoint import open_checkpoint
from merging.reading.tied import count_multiplicity, tied_aliases

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, head_dim=8, pad_token_id=0, bos_token_id=1,
             eos_token_id=2)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)

# (model_type, tie_word_embeddings as written to config.json — None: removed, the config class's default applies,
#  extra config, the alias expected)
FAMILIES = [
    ("qwen2", True, {}, {"lm_head.weight": "model.embed_tokens.weight"}),
    ("qwen2", False, {}, {}),
    ("llama", True, {}, {"lm_head.weight": "model.embed_tokens.weight"}),
    ("mistral", False, {}, {}),
    ("gemma", None, {}, {"lm_head.weight": "model.embed_tokens.weight"}),  # Gemma ties by default
    ("gpt2", True, {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64},
     {"lm_head.weight": "transformer.wte.weight"}),
    ("gpt_neox", True, {}, {"lm_head.weight": "gpt_neox.embed_in.weight"}),
    ("qwen3_moe", True, MOE, {"lm_head.weight": "model.embed_tokens.weight"}),  # experts fused in memory
]


def save_family(folder: Path, model_type: str, tie: bool | None, extra: dict) -> Path:
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = CONFIG_MAPPING[model_type](**SMALL, **extra, tie_word_embeddings=bool(tie) if tie is not None else True)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    if tie is None:
        doc = json.loads((folder / "config.json").read_text())
        del doc["tie_word_embeddings"]
        (folder / "config.json").write_text(json.dumps(doc))
    return folder


def state_dict_elements(folder: Path) -> tuple[int, dict[str, str]]:
    """Float elements of the loaded model's state_dict() (tied aliases included), and its aliases: listed names
    that share their storage with another listed name."""
    from transformers import AutoModelForCausalLM

    sd = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, trust_remote_code=False).state_dict()
    first: dict[int, str] = {}
    aliases = {}
    for k, v in sd.items():
        if v.data_ptr() in first:
            aliases[k] = first[v.data_ptr()]
        first.setdefault(v.data_ptr(), k)
    return sum(v.numel() for v in sd.values() if v.is_floating_point()), aliases


@pytest.mark.parametrize("model_type,tie,extra,expected", FAMILIES, ids=[f"{f[0]}-{f[1]}" for f in FAMILIES])
def test_aliases_match_state_dict(tmp_path, model_type, tie, extra, expected):
    folder = save_family(tmp_path / model_type, model_type, tie, extra)
    ckpt = open_checkpoint(folder)
    assert tied_aliases(ckpt) == expected
    listed, aliases = state_dict_elements(folder)
    assert aliases == expected  # what transformers itself ties
    weights = count_multiplicity(ckpt)
    stored = sum(e.numel * weights.get(n, 1) for n, e in ckpt.tensors.items() if e.dtype in ("F32", "BF16", "F16"))
    assert stored == listed


def test_a_stored_head_is_no_alias(tmp_path):
    """A tied model whose files also hold lm_head.weight (equal to the embedding): transformers lists the stored
    one, so no alias is added."""
    from safetensors.torch import load_file, save_file

    folder = save_family(tmp_path / "m", "qwen2", True, {})
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    ckpt = open_checkpoint(folder)
    assert tied_aliases(ckpt) == {} and count_multiplicity(ckpt) == {}
    assert state_dict_elements(folder)[0] == sum(e.numel for e in ckpt.tensors.values())


@pytest.mark.parametrize("change,message", [
    ({"tie_word_embeddings": "yes"}, "not true or false"),
    ({"tie_word_embeddings": None, "model_type": "no-such-family"}, "cannot tell whether it ties"),
    ({"rename": "model.emb.weight"}, "which stored tensor that is is not clear"),
])
def test_unclear_ties_are_refused(tmp_path, change, message):
    """When config.json cannot say what transformers would tie, counting aliases is refused in one line."""
    from safetensors.torch import load_file, save_file

    folder = save_family(tmp_path / "m", "qwen2", True, {})
    doc = json.loads((folder / "config.json").read_text())
    for key, value in change.items():
        if key == "rename":
            tensors = load_file(folder / "model.safetensors")
            tensors[value] = tensors.pop("model.embed_tokens.weight")
            save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        elif value is None:
            del doc[key]
        else:
            doc[key] = value
    (folder / "config.json").write_text(json.dumps(doc))
    with pytest.raises(RamStudioError, match=message) as err:
        tied_aliases(open_checkpoint(folder))
    assert "\n" not in str(err.value)

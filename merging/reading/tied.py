"""Tied aliases: the names a model loaded by transformers lists in `state_dict()` that its files do not store.

A model with tied word embeddings stores the input embedding once, but once loaded its `state_dict()` also
lists the output head, `lm_head.weight`, pointing at the same tensor. Code that counts over `state_dict()`
(the RAM authors' script does) counts the embedding twice; RAM Studio counts stored tensors once unless asked
(`count_tied_twice`). Which aliases exist is read from config.json alone, never by loading the model or its code.

Measured with transformers 5.24 (`state_dict()` of each family's model against the files `save_pretrained`
writes): with `tie_word_embeddings` true the only alias is `lm_head.weight`, pointing at the input embedding
named in `EMBEDDING_NAMES`, for Llama, Mistral, Qwen2/2.5/3, Qwen2-MoE, Qwen3-MoE, Qwen3-Next, Mixtral,
Gemma 1-3, Phi, OLMo 2, Granite, StarCoder 2, Cohere, StableLM, DeepSeek-V3, GPT-2 and GPT-NeoX (fused MoE
experts are renamed in memory, but hold the same elements). Where config.json omits `tie_word_embeddings`,
transformers uses its config class's default (Gemma, GPT-2: tied; Llama, Qwen: untied): so do we.
"""
from __future__ import annotations

from merging.common.errors import RamStudioError, printable
from merging.reading.checkpoint import Checkpoint

HEAD = "lm_head.weight"
ONCE = "the method's own flags without --count-tied-twice (the authors' presets always set it)."
# The input embedding lm_head.weight is tied to, as the families above name it in their files.
EMBEDDING_NAMES = (
    "model.embed_tokens.weight",  # Llama, Qwen, Mistral, Gemma, Phi, the MoE families …
    "model.language_model.embed_tokens.weight",  # multimodal wrappers (Gemma 3), current layout
    "language_model.model.embed_tokens.weight",  # the same, files written before transformers 5
    "transformer.wte.weight",  # GPT-2
    "gpt_neox.embed_in.weight",  # GPT-NeoX, Pythia
)


def ties_embeddings(ckpt: Checkpoint) -> bool:
    """Whether transformers ties this model's output head to its input embedding: config.json's
    `tie_word_embeddings`, else the default of transformers' config class for its `model_type`."""
    cfg = ckpt.config or {}
    value = cfg.get("tie_word_embeddings")
    if isinstance(value, bool):
        return value
    if value is not None:
        raise RamStudioError(f"{ckpt.label}: config.json's tie_word_embeddings is {printable(repr(value), 40)}, "
                             "not true or false.", "Fix config.json, or count stored tensors once: " + ONCE)
    model_type = cfg.get("model_type")
    default = _config_default(model_type) if isinstance(model_type, str) else None
    if default is None:
        raise RamStudioError(
            f"{ckpt.label}: cannot tell whether it ties its embeddings (config.json has no tie_word_embeddings and "
            f"transformers does not know model_type {printable(repr(model_type), 60)}).",
            "Counting as transformers' state_dict() lists tensors needs to know; count stored tensors once: " + ONCE)
    return default


def _config_default(model_type: str) -> bool | None:
    """transformers' default tie_word_embeddings for `model_type` (its config class only: no model code)."""
    from transformers import CONFIG_MAPPING

    try:
        value = getattr(CONFIG_MAPPING[model_type], "tie_word_embeddings", None)
    except (KeyError, ImportError, AttributeError):
        return None
    return value if isinstance(value, bool) else None


def tied_aliases(ckpt: Checkpoint) -> dict[str, str]:
    """{alias: stored tensor} for what `state_dict()` of the loaded model lists beyond its files: {} when the
    embeddings are not tied or the head is stored (transformers then lists the stored one)."""
    if HEAD in ckpt.tensors or not ties_embeddings(ckpt):
        return {}
    found = [n for n in EMBEDDING_NAMES if n in ckpt.tensors]
    if len(found) != 1:
        what = "none" if not found else ", ".join(found)
        raise RamStudioError(
            f"{ckpt.label} ties lm_head.weight to its input embedding, but which stored tensor that is is not "
            f"clear (known embedding names found: {what}).",
            "Count stored tensors once: " + ONCE)
    return {HEAD: found[0]}


def count_multiplicity(ckpt: Checkpoint) -> dict[str, int]:
    """How many times each stored tensor appears in `state_dict()` when it does more than once (tensor → 2
    for a tied embedding): the weights whole-model counts take to count as code over `state_dict()` does."""
    out: dict[str, int] = {}
    for source in tied_aliases(ckpt).values():
        out[source] = out.get(source, 1) + 1
    return out

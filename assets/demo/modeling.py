"""Character-level tokenizer and tiny Qwen2 architecture for the demo, plus Hub-style save/load."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM)

EOS = "<|endoftext|>"  # Qwen-style: end of text doubles as padding
CHARS = [chr(c) for c in range(32, 127)]  # printable ASCII; every task string uses only these
_QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
                r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level byte-level BPE (no merges) with Qwen2's exact pre-tokenizer pipeline.

    transformers maps `model_type: qwen2` to `Qwen2Tokenizer`, which rebuilds the normalizer,
    pre-tokenizer and decoder from its own defaults; using those same components here makes the
    saved `tokenizer.json` load identically through `AutoTokenizer` and `Tokenizer.from_file`.
    """
    vocab = {EOS: 0}
    for ch in CHARS:
        vocab[_byte_level(ch)] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS, special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   unk_token=EOS, model_max_length=512, padding_side="left")


def _byte_level(ch: str) -> str:
    """The GPT-2 byte-to-unicode symbol of an ASCII character (space becomes 'Ġ')."""
    return "\u0120" if ch == " " else ch


def model_config(vocab_size: int, hidden: int = 96, layers: int = 3, heads: int = 4,
                 intermediate: int = 256) -> Qwen2Config:
    """A standard Qwen2 config scaled down to a few hundred thousand parameters."""
    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=512, tie_word_embeddings=True, rope_theta=10000.0,
        bos_token_id=None, eos_token_id=0, pad_token_id=0, dtype="bfloat16",
        use_sliding_window=False)


def new_model(tokenizer: PreTrainedTokenizerFast, seed: int, **sizes: int) -> Qwen2ForCausalLM:
    """A freshly initialised fp32 model (deterministic for a given seed)."""
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(model_config(len(tokenizer), **sizes)).float()


def generation_config() -> GenerationConfig:
    """Greedy decoding config stored next to every checkpoint."""
    return GenerationConfig(do_sample=False, eos_token_id=0, pad_token_id=0, max_new_tokens=96)


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """Write a Hub-style folder with bf16 safetensors, atomically (temp folder, then rename)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        bf16 = model.to(torch.bfloat16)
        bf16.generation_config = generation_config()
        bf16.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        model.float()
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        model.float()
        raise


def _replace_dir(src: Path, dst: Path) -> None:
    """Swap `src` into place at `dst` with renames so readers never see a half-written folder."""
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


def load_checkpoint(path: Path, dtype: torch.dtype = torch.float32
                    ) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load any demo-compatible folder (base, agent, merged export) with transformers."""
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    tok = AutoTokenizer.from_pretrained(str(path))
    tok.padding_side = "left"
    model.eval()
    return model, tok


def write_json(path: Path, obj: object) -> None:
    """Write JSON atomically (used for small result files)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)

"""Tokenizers (character-level, or a byte-level BPE trained on the tasks' text) and the tiny Qwen2
architecture of the demo, plus Hub-style save/load."""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

if TYPE_CHECKING:
    from .suites import TaskSuite

EOS = "<|endoftext|>"  # Qwen-style: end of text doubles as padding
CHARS = [chr(c) for c in range(32, 127)]  # printable ASCII; every task string uses only these
_WORD = re.compile("\u0120?[a-z]+")  # a word piece, optionally with the byte-level space marker
_QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
                r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def _qwen2_pipeline(tok: Tokenizer) -> Tokenizer:
    """Qwen2's normalizer / pre-tokenizer / decoder (what `Qwen2Tokenizer` rebuilds on load)."""
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    tok.add_special_tokens([AddedToken(EOS, special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   unk_token=EOS, model_max_length=512, padding_side="left")


TOKENIZER_CORPUS: tuple[tuple[str, int], ...] = (("code", 3000), ("tool", 3000))


def build_tokenizer(kind: str = "char", vocab_size: int = 280, seed: int = 0,
                    corpus: tuple[tuple[str, int], ...] = TOKENIZER_CORPUS,
                    suite: "str | TaskSuite | None" = None) -> PreTrainedTokenizerFast:
    """The demo tokenizer: `char` (one token per printable ASCII character) or `bpe` (a byte-level
    BPE trained on the tasks' training text, like the tokenizer of a real LLM; frequent words
    such as tool and city names become single tokens, rare strings stay split into characters).
    `corpus` gives the number of train-split examples per task in the tokenizer's training text:
    the memory task's random haystacks are a small share of it, so they are tokenized mostly
    character by character (like text in a script the tokenizer was hardly trained on) and the
    query key stays the same token as the needle's key. `suite` names the task suite whose answers
    (with their envelope, if any) are in the text; None is the original suite.

    Both use Qwen2's exact pre-tokenizer pipeline: transformers maps `model_type: qwen2` to
    `Qwen2Tokenizer`, which rebuilds the normalizer, pre-tokenizer and decoder from its own
    defaults (keeping the vocabulary and merges); using those same components here makes the
    saved `tokenizer.json` load identically through `AutoTokenizer` and `Tokenizer.from_file`.
    """
    if kind == "char":
        return _bpe_tokenizer(_char_vocab(), [])
    if kind != "bpe":
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected 'char' or 'bpe'")
    # Train the merges on word pieces only (a run of lowercase letters, optionally after one
    # space): Qwen2's pre-tokenizer glues one punctuation character to a letter run (':x',
    # '(city'), and merges across it would give a variable a different token where it is
    # assigned and where it is used. The trained merges then go into a BPE with Qwen2's pipeline.
    trainer_tok = Tokenizer(models.BPE(continuing_subword_prefix="", end_of_word_suffix="",
                                       fuse_unk=False, byte_fallback=False))
    trainer_tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r" ?[a-z]+|[^a-z]"), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[EOS],
                                  initial_alphabet=[_byte_level(c) for c in CHARS])
    trainer_tok.train_from_iterator(tokenizer_corpus(seed, corpus, suite), trainer)
    vocab = _char_vocab()
    merges = []
    for pair in json.loads(trainer_tok.to_str())["model"]["merges"]:
        a, b = pair.split(" ") if isinstance(pair, str) else pair
        if not _WORD.fullmatch(a + b):
            raise AssertionError(f"unexpected merge {a!r} + {b!r}")
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
    return _bpe_tokenizer(vocab, merges)


def _char_vocab() -> dict[str, int]:
    """EOS, then one token per printable ASCII character."""
    vocab = {EOS: 0}
    for ch in CHARS:
        vocab[_byte_level(ch)] = len(vocab)
    return vocab


def _bpe_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]]) -> PreTrainedTokenizerFast:
    """A byte-level BPE of this vocabulary and these merges with Qwen2's pipeline and the demo's EOS."""
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    return _wrap(_qwen2_pipeline(tok))


def tokenizer_corpus(seed: int = 0, corpus: tuple[tuple[str, int], ...] = TOKENIZER_CORPUS,
                     suite: "str | TaskSuite | None" = None) -> list[str]:
    """Training text of the BPE tokenizer: prompts and answers (as separate lines, since they are
    tokenized separately) of train-split examples of each task, in a fixed order."""
    from .suites import TaskSuite, get_suite  # local import: suites does not depend on modeling
    draw = (suite if isinstance(suite, TaskSuite) else get_suite(suite)).sample_train
    rng = random.Random(seed + 4242)
    lines: list[str] = []
    for task, n in corpus:
        for _ in range(n):
            ex = draw(task, rng)
            lines += [ex.prompt, ex.answer]
    return lines


def _byte_level(ch: str) -> str:
    """The GPT-2 byte-to-unicode symbol of an ASCII character (space becomes 'Ġ')."""
    return "\u0120" if ch == " " else ch


def model_config(vocab_size: int, hidden: int = 96, layers: int = 3, heads: int = 4,
                 intermediate: int = 256, act: str = "silu", tie: bool = True) -> Qwen2Config:
    """A standard Qwen2 config scaled down (gated MLP act(gate)·up; `act` e.g. silu or relu)."""
    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
        hidden_act=act, max_position_embeddings=512, tie_word_embeddings=tie, rope_theta=10000.0,
        bos_token_id=None, eos_token_id=0, pad_token_id=0, dtype="bfloat16",
        use_sliding_window=False)


def new_model(tokenizer: PreTrainedTokenizerFast, seed: int, suite: str | None = None,
              **arch: object) -> Qwen2ForCausalLM:
    """A freshly initialised fp32 model (deterministic for a given seed); `arch` are the keyword
    arguments of `model_config` (sizes, act, tie). A task suite other than the original one is
    recorded in config.json (`tasks.SUITE_CONFIG_KEY`), so every agent trained from this base and
    every merge of them (config.json is copied from the base) says which tasks score it."""
    from .suites import SUITE_CONFIG_KEY  # local import: suites does not depend on modeling
    config = model_config(len(tokenizer), **arch)
    if suite not in (None, "demo"):
        setattr(config, SUITE_CONFIG_KEY, suite)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).float()


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
    """Load any demo-compatible folder (base, agent, merged export) with transformers (safetensors
    only: a folder holding just a pickled `pytorch_model.bin` is refused, never unpickled; the folder's own
    Python never runs: merging/reading/transformers_load.py)."""
    from merging.reading.transformers_load import load_causal_lm, load_tokenizer

    model = load_causal_lm(path, dtype)
    tok = load_tokenizer(path)
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

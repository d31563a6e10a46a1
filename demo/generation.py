"""Batched left-padded generation shared by evaluation (greedy) and RL rollouts (sampling).

`generate` is transformers' `generate` (the RL rollouts sample through it, so the demo build stays as it
was). `greedy_texts` is the evaluator's fast path: the same greedy decoding written out for the Qwen2/Llama
architecture with a preallocated KV cache — every prompt of a task in one decoding batch, the prompts
prefilled by prompt length (no padding), finished rows dropped from the batch — and the same
completions as `generate(..., sample=False)` (tests/demo/test_generation.py compares them).
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from .suites import TaskSuite
from .tasks import MAX_NEW_TOKENS  # MAX_NEW_TOKENS re-exported: the RL rollouts' budgets


def max_new_tokens(task: str, suite: TaskSuite | None = None) -> int:
    """Generation budget of a task; a suite with an answer envelope adds its `extra_tokens`."""
    return MAX_NEW_TOKENS[task] if suite is None else suite.max_new_tokens[task]


# Bytes a prefill chunk's activations, and a decoding group's KV cache, may take (rows are split beyond).
CHUNK_BYTES = 256 << 20
CACHE_BYTES = 512 << 20
COMPACT_BELOW = 0.75  # finished rows leave the decoding batch once fewer than this share is still running
# Decoding a small model on the CPU is a stream of small operations: one intra-op thread. On this 2-core
# machine a second thread saved little when idle and cost 3-14x in wall time when other processes shared the
# cores (validation scoring of the tool agent: 0.7-1.4 s with one thread, 2.4-13 s with two, same minute).
SMALL_HIDDEN = 1024


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


def greedy_texts(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, prompts: Sequence[str],
                 max_new_tokens: int) -> list[str]:
    """Greedy completions of `prompts`, in input order: the fast decoder where the model allows it
    (`fast_decoding_supported`), else transformers' `generate` (`reference_greedy_texts`)."""
    if not prompts:
        return []
    if fast_decoding_supported(model) and (tokenizer.pad_token_id is not None or tokenizer.eos_token_id is not None):
        with _cpu_threads(model):
            texts = _fast_greedy(model, tokenizer, prompts, max_new_tokens)
        if texts is not None:
            return texts
    return reference_greedy_texts(model, tokenizer, prompts, max_new_tokens)


@contextlib.contextmanager
def _cpu_threads(model: PreTrainedModel) -> Iterator[None]:
    """One torch thread while a small model decodes on the CPU (see SMALL_HIDDEN), restored afterwards."""
    small = next(model.parameters()).device.type == "cpu" and model.config.hidden_size <= SMALL_HIDDEN
    before = torch.get_num_threads()
    if small and before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if small and before != 1:
            torch.set_num_threads(before)


def reference_greedy_texts(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, prompts: Sequence[str],
                           max_new_tokens: int, batch_size: int = 64) -> list[str]:
    """Greedy completions through transformers' `generate`, prompts sorted by length in batches of
    `batch_size` (the evaluator's decoding before the fast path, and the reference it is tested against)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outputs = [""] * len(prompts)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        _, _, texts = generate(model, tokenizer, [prompts[i] for i in idx], max_new_tokens)
        for i, text in zip(idx, texts):
            outputs[i] = text
    return outputs


# Generation settings under which greedy decoding is a plain argmax (anything else: transformers decodes).
_NEUTRAL_GENERATION = {
    "repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0), "bad_words_ids": (None,),
    "min_length": (None, 0), "min_new_tokens": (None, 0), "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,), "suppress_tokens": (None,), "begin_suppress_tokens": (None,),
    "sequence_bias": (None,), "num_beams": (None, 1), "renormalize_logits": (None, False),
    "exponential_decay_length_penalty": (None,), "stop_strings": (None,), "guidance_scale": (None, 1.0),
    "remove_invalid_values": (None, False), "watermarking_config": (None,), "encoder_no_repeat_ngram_size": (None, 0),
}


def fast_decoding_supported(model: PreTrainedModel) -> bool:
    """True for a Qwen2 or Llama causal LM with plain RoPE, full attention and a generation config that
    adds nothing to greedy argmax (the architecture the fast decoder writes out)."""
    cfg = model.config
    if type(model).__name__ not in ("Qwen2ForCausalLM", "LlamaForCausalLM"):
        return False
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default" or any(
            t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return False
    if getattr(cfg, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return False
    gen = getattr(model, "generation_config", None)
    return all(getattr(gen, k, None) in ok for k, ok in _NEUTRAL_GENERATION.items())


class _Decoder:
    """Functional forward of a Qwen2/Llama model over a preallocated KV cache (weights read from the module
    at call time, so a sweep that copies new weights into it is scored as it is now)."""

    def __init__(self, model: PreTrainedModel) -> None:
        cfg = model.config
        self.model = model
        self.inner = model.model
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.rep = self.heads // self.kv_heads
        self.eps = cfg.rms_norm_eps
        self.layers = list(self.inner.layers)
        self.param = next(model.parameters())
        self.dtype = self.param.dtype

    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for positions 0..length-1, computed as transformers' rotary embedding does per position."""
        inv_freq = self.inner.rotary_emb.inv_freq
        freqs = torch.arange(length, device=inv_freq.device)[:, None].float() * inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = getattr(self.inner.rotary_emb, "attention_scaling", 1.0)
        return (emb.cos() * scale).to(self.dtype), (emb.sin() * scale).to(self.dtype)

    def rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor],
                k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, mask: torch.Tensor | None) -> torch.Tensor:
        """Run `ids` (B, t) at positions `pos` (B, t), writing their keys/values into cache columns
        [start, start + t), and return the last position's logits (B, vocab). A prompt (t > 1) has no
        padding and attends causally from column `start` on; one new token (t = 1) attends to the columns
        [0, start] that `mask` (B, 1, 1, start + 1) allows. The last layer only needs its keys and values
        at every position: its attention and MLP run for the last position alone."""
        rows, t = ids.shape
        x = F.embedding(ids, self.inner.embed_tokens.weight)
        cos, sin = tables[0][pos][:, None], tables[1][pos][:, None]
        end = start + t
        for li, layer in enumerate(self.layers):
            att, mlp = layer.self_attn, layer.mlp
            h = self.rms(x, layer.input_layernorm.weight)
            k = F.linear(h, att.k_proj.weight, att.k_proj.bias).view(rows, t, self.kv_heads, self.head_dim)
            v = F.linear(h, att.v_proj.weight, att.v_proj.bias).view(rows, t, self.kv_heads, self.head_dim)
            k_cache[li, :, :, start:end] = self.rotate(k.transpose(1, 2), cos, sin)
            v_cache[li, :, :, start:end] = v.transpose(1, 2)
            last_only = t > 1 and li == len(self.layers) - 1
            if last_only:
                x, h, q_cos, q_sin = x[:, -1:], h[:, -1:], cos[:, :, -1:], sin[:, :, -1:]
            else:
                q_cos, q_sin = cos, sin
            tq = x.shape[1]
            q = F.linear(h, att.q_proj.weight, att.q_proj.bias).view(rows, tq, self.heads, self.head_dim)
            q = self.rotate(q.transpose(1, 2), q_cos, q_sin)
            if tq == 1:  # one query per row: heads grouped on their key/value head, as transformers does
                keys, values = k_cache[li, :, :, :end], v_cache[li, :, :, :end]
                if t > 1:  # the prompt's last position sees the whole (unpadded) prompt
                    keys, values = keys[:, :, start:], values[:, :, start:]
                o = F.scaled_dot_product_attention(q.reshape(rows, self.kv_heads, self.rep, self.head_dim),
                                                   keys, values, attn_mask=mask if t == 1 else None,
                                                   scale=att.scaling)
            else:
                keys = k_cache[li, :, :, start:end, None].expand(-1, -1, -1, self.rep, -1)
                keys = keys.transpose(2, 3).reshape(rows, self.heads, t, self.head_dim)
                values = v_cache[li, :, :, start:end, None].expand(-1, -1, -1, self.rep, -1)
                values = values.transpose(2, 3).reshape(rows, self.heads, t, self.head_dim)
                o = F.scaled_dot_product_attention(q, keys, values, scale=att.scaling, is_causal=True)
            o = o.reshape(rows, self.heads, tq, self.head_dim)
            x = x + F.linear(o.transpose(1, 2).reshape(rows, tq, -1), att.o_proj.weight, att.o_proj.bias)
            h = self.rms(x, layer.post_attention_layernorm.weight)
            gate = F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias)
            up = F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias)
            x = x + F.linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        last = self.rms(x[:, -1], self.inner.norm.weight)
        return F.linear(last, self.model.lm_head.weight, getattr(self.model.lm_head, "bias", None)).float()


def _groups(lengths: list[int], limit: int, cost) -> list[list[int]]:
    """Split length-sorted row indices into consecutive groups whose `cost(rows, longest)` stays under `limit`."""
    groups: list[list[int]] = [[]]
    for i, n in enumerate(lengths):
        if groups[-1] and cost(len(groups[-1]) + 1, n) > limit:
            groups.append([])
        groups[-1].append(i)
    return groups


@torch.no_grad()
def _fast_greedy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, prompts: Sequence[str],
                 max_new_tokens: int) -> list[str] | None:
    """Greedy decoding with a KV cache: rows sorted by token length, split into decoding groups that fit
    CACHE_BYTES; each group prefilled by prompt length, then decoded as one batch. None when a prompt encodes
    to no token at all (transformers' `generate` decides what that means)."""
    dec = _Decoder(model)
    device = dec.param.device
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    encoded = _encoded(tokenizer, prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    lengths = [len(encoded[i]) for i in order]
    if lengths[0] == 0 or max_new_tokens < 1:
        return None
    per_col = 2 * len(dec.layers) * dec.kv_heads * dec.head_dim * dec.param.element_size()
    groups = _groups(lengths, CACHE_BYTES, lambda rows, longest: rows * (longest + max_new_tokens) * per_col)
    tables = dec.rope_tables(lengths[-1] + max_new_tokens)
    texts = [""] * len(prompts)
    for group in groups:
        rows = [encoded[order[i]] for i in group]
        completion = _decode_group(dec, rows, max_new_tokens, eos, pad, tables, device)
        for i, text in zip(group, tokenizer.batch_decode(completion, skip_special_tokens=True)):
            texts[order[i]] = text
    return texts


# Token ids of prompt lists already seen, per tokenizer (a sweep decodes the same prompts for every candidate).
_ENCODED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _encoded(tokenizer: PreTrainedTokenizerFast, prompts: Sequence[str]) -> list[list[int]]:
    """The prompts' token ids (no padding), remembered for this tokenizer object."""
    key = tuple(prompts)
    try:
        seen = _ENCODED.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that cannot be weakly referenced: encode every time
        return tokenizer(list(prompts))["input_ids"]
    if key not in seen:
        if len(seen) >= 16:
            seen.clear()
        seen[key] = tokenizer(list(prompts))["input_ids"]
    return seen[key]


def _decode_group(dec: _Decoder, rows: list[list[int]], max_new: int, eos: int | None, pad: int,
                  tables: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> torch.Tensor:
    """Greedy tokens (B, steps) for length-sorted prompt rows; rows that finished are filled with `pad`."""
    count, width = len(rows), len(rows[-1])
    cols = width + max_new
    shape = (len(dec.layers), count, dec.kv_heads, cols, dec.head_dim)
    k_cache = torch.empty(shape, dtype=dec.dtype, device=device)
    v_cache = torch.empty(shape, dtype=dec.dtype, device=device)
    # Padding columns are masked, but a masked value still multiplies its (zero) weight: keep them finite.
    k_cache[:, :, :, :width - len(rows[0])] = 0
    v_cache[:, :, :, :width - len(rows[0])] = 0
    valid = torch.zeros(count, cols, dtype=torch.bool, device=device)
    logits = torch.empty(count, dec.model.config.vocab_size, device=device)
    # Prefill: rows of one prompt length at a time (no padding: causal attention, no mask), written into the
    # cache's columns [width - length, width), so that every row's prompt ends at column `width`.
    lengths = [len(r) for r in rows]
    per_token = dec.param.element_size() * (2 * dec.model.config.intermediate_size + 6 * dec.model.config.hidden_size)
    chunks: list[list[int]] = []
    for i, n in enumerate(lengths):
        if not chunks or lengths[chunks[-1][0]] != n or (len(chunks[-1]) + 1) * n * per_token > CHUNK_BYTES:
            chunks.append([])
        chunks[-1].append(i)
    for chunk in chunks:
        t = lengths[chunk[0]]
        ids = torch.tensor([rows[i] for i in chunk], dtype=torch.long, device=device)
        pos = torch.arange(t, device=device).expand(len(chunk), t)
        k_part = k_cache.new_empty((len(dec.layers), len(chunk), dec.kv_heads, t, dec.head_dim))
        v_part = torch.empty_like(k_part)
        sel = slice(chunk[0], chunk[-1] + 1)  # chunks are consecutive runs of the sorted rows
        logits[sel] = dec.forward(ids, pos, tables, k_part, v_part, 0, None)
        k_cache[:, sel, :, width - t:width] = k_part
        v_cache[:, sel, :, width - t:width] = v_part
        valid[sel, width - t:width] = True
    # Decode: one token per running row per step; rows that emitted EOS leave the batch in batches.
    out = torch.full((count, max_new), pad, dtype=torch.long, device=device)
    live = torch.arange(count, device=device)  # original row of each batch row
    alive = torch.ones(count, dtype=torch.bool, device=device)
    nxt = torch.tensor(lengths, device=device)  # position of the next token
    steps = 0
    for step in range(max_new):
        tok = torch.where(alive, logits.argmax(-1), pad)
        out[live, step] = tok
        steps = step + 1
        if eos is not None:
            alive &= tok != eos
        running = int(alive.sum())
        if step == max_new - 1 or running == 0:
            break
        if running < COMPACT_BELOW * len(live):
            keep = alive.nonzero().squeeze(1)
            live, tok, nxt, alive = live[keep], tok[keep], nxt[keep], alive[keep]
            k_cache, v_cache = k_cache.index_select(1, keep), v_cache.index_select(1, keep)
            valid = valid[keep]
        col = width + step
        valid[:, col] = True
        logits = dec.forward(tok[:, None], nxt[:, None], tables, k_cache, v_cache, col,
                             valid[:, None, None, :col + 1])
        nxt = nxt + 1
    return out[:, :steps]

"""Tiny real checkpoints for tests: a Qwen2ForCausalLM base saved by transformers, and sparse agents."""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file, save_file


def tiny_config(vocab: int = 96, tie: bool = False):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=tie)


def save_tokenizer(folder: Path, vocab: int = 96) -> None:
    """A word-level tokenizer.json that AutoTokenizer loads (characters as tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 32 + vocab - 2)]
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(["<pad>", "<unk>"] + chars)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")
    fast.save_pretrained(folder)


def make_base(folder: Path, *, shard: str | None = "40KB", seed: int = 0, dtype=torch.bfloat16,
              tie: bool = False, vocab: int = 96) -> Path:
    """Save a randomly initialised tiny Qwen2 model (sharded when `shard` is given) with a tokenizer."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_config(vocab, tie)).to(dtype)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(folder, **kwargs)
    save_tokenizer(folder, vocab)
    return folder


def state(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a (possibly sharded) folder; only for tiny test models."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(f))
    return out


def write_like(src: Path, dst: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """Write `tensors` into `dst` with the same shard layout, index and side files as `src`."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in Path(src).iterdir():
        if f.suffix == ".safetensors":
            names = list(load_file(f).keys())
            save_file({n: tensors[n].contiguous() for n in names if n in tensors}, dst / f.name,
                      metadata={"format": "pt"})
        elif f.is_file():
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def make_agent(base: Path, dst: Path, density: float, *, seed: int, scale: float = 0.02,
               region: tuple[float, float] | None = None) -> Path:
    """An agent = base + a sparse update on a random `density` share of every float tensor.

    `region` (lo, hi) restricts updates to that fraction range of each tensor's flat index, so tests
    can make agents overlap or stay disjoint on purpose.
    """
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state(base).items():
        flat = t.float().reshape(-1).clone()
        mask = torch.rand(flat.numel(), generator=g) < density
        if region is not None:
            idx = torch.arange(flat.numel())
            mask &= (idx >= int(region[0] * flat.numel())) & (idx < int(region[1] * flat.numel()))
        flat[mask] += torch.randn(int(mask.sum()), generator=g) * scale
        out[name] = flat.view(t.shape).to(t.dtype)
    return write_like(base, dst, out)


def make_family(root: Path, densities: Sequence[float] = (0.05, 0.4, 0.5), **kw) -> tuple[Path, list[Path]]:
    """A base and one agent per density under `root`."""
    base = make_base(root / "base", **kw)
    agents = [make_agent(base, root / f"agent{i}", d, seed=100 + i) for i, d in enumerate(densities)]
    return base, agents


def checksums(folders) -> dict[str, str]:
    out = {}
    for folder in folders:
        for p in sorted(Path(folder).rglob("*")):
            if p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def split_safetensors(shard: Path) -> tuple[dict, bytes]:
    """A safetensors file's JSON header and the bytes after it (for tests that damage files)."""
    raw = Path(shard).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def join_safetensors(shard: Path, header: object, data: bytes) -> None:
    """Write a header (any JSON) and data back as a safetensors file, padding the header like the writer."""
    new = json.dumps(header).encode()
    new += b" " * (-(len(new) + 8) % 8)
    Path(shard).write_bytes(struct.pack("<Q", len(new)) + new + data)


# Names that would be markup, links, images, templates, formulas or terminal controls if shown raw.
# Folder names cannot hold '/', so their URLs use the slash-less form browsers still load (https:host).
HOSTILE_FOLDERS = ["base <a href=https:127.0.0.2:9>b", "![x](https:127.0.0.2:9)[Click to fix](https:127.0.0.2:9)",
                   "<img src=https:127.0.0.2:9> www.evil.example %{x} $x$ :red[x]",
                   "=cmd|' \u202eevil `code` *em* <script>alert(1)"]
HOSTILE_TENSOR = ("model.![t](http://127.0.0.2:9/t.png) [Click to fix](http://127.0.0.2:9/p) "
                  "<img src=http://127.0.0.2:9/i.png> %{y} $y$.weight")


def make_hostile_family(root: Path, nan_in: int | None = None) -> tuple[Path, list[Path]]:
    """A tiny base and three agents in folders named like HOSTILE_FOLDERS, every model with an extra tensor
    named HOSTILE_TENSOR (agent `nan_in` holds a NaN there, to reach the error boxes)."""
    base = make_base(root / HOSTILE_FOLDERS[0], shard=None)
    agents = [make_agent(base, root / name, d, seed=200 + i) for i, (name, d) in
              enumerate(zip(HOSTILE_FOLDERS[1:], (0.05, 0.4, 0.5)))]
    g = torch.Generator().manual_seed(1)
    extra = torch.randn(8, 4, generator=g)
    for i, folder in enumerate([base, *agents]):
        shard = folder / "model.safetensors"
        tensors = load_file(shard)
        t = extra + (0 if i == 0 else torch.randn(8, 4, generator=g) * 0.05)
        if nan_in is not None and i == nan_in + 1:
            t[3, 1] = float("nan")
        tensors[HOSTILE_TENSOR] = t.to(torch.bfloat16)
        save_file(tensors, shard, metadata={"format": "pt"})
    return base, agents

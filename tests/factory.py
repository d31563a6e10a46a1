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


def make_vocab_agent(base: Path, dst: Path, tokens: Sequence[str], *, seed: int, density: float = 0.1,
                     scale: float = 0.002, special: bool = False) -> Path:
    """An agent whose tokenizer extends the base's with `tokens` (appended after the base's ids, as
    `add_tokens` / `add_special_tokens` do) and whose vocabulary tensors have a trained row for each: a sparse
    update on every float tensor of the base, new rows drawn at random, config vocab_size updated."""
    from transformers import PreTrainedTokenizerFast

    agent = make_agent(base, dst, density, seed=seed, scale=scale)
    # the saved tokenizer as it is (AutoTokenizer would pick Qwen2's class from the config, which appends its own
    # end-of-text token)
    tok = PreTrainedTokenizerFast.from_pretrained(base, trust_remote_code=False)
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(tokens)})
    else:
        tok.add_tokens(list(tokens))
    tok.save_pretrained(agent)
    rows = len(tok)
    g = torch.Generator().manual_seed(seed + 1)
    tensors = state(agent)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in tensors and tensors[name].shape[0] < rows:
            t = tensors[name]
            extra = torch.randn(rows - t.shape[0], *t.shape[1:], generator=g) * 0.02
            tensors[name] = torch.cat([t, extra.to(t.dtype)])
    for f in Path(agent).glob("*.safetensors"):
        f.unlink()
    (Path(agent) / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file({n: t.contiguous() for n, t in tensors.items()}, Path(agent) / "model.safetensors",
              metadata={"format": "pt"})
    cfg = json.loads((Path(agent) / "config.json").read_text())
    cfg["vocab_size"] = rows
    (Path(agent) / "config.json").write_text(json.dumps(cfg, indent=2))
    return agent


def make_head_agent(base: Path, dst: Path, *, seed: int, head_noise: float = 0.0, density: float = 0.1,
                    scale: float = 0.002) -> Path:
    """An agent of a tied base saved with an explicit lm_head.weight and tie_word_embeddings false, as some RL
    exports write it: equal to its embeddings (`head_noise` 0) or untied by training (noise of that scale on
    a random half of the head's elements)."""
    agent = make_agent(base, dst, density, seed=seed, scale=scale)
    tensors = state(agent)
    embed = tensors["model.embed_tokens.weight"]
    head = embed.clone()
    if head_noise:
        g = torch.Generator().manual_seed(seed + 2)
        mask = torch.rand(head.shape, generator=g) < 0.5
        head = (head.float() + mask * torch.randn(head.shape, generator=g) * head_noise).to(embed.dtype)
    tensors["lm_head.weight"] = head
    for f in Path(agent).glob("*.safetensors"):
        f.unlink()
    (Path(agent) / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file({n: t.contiguous() for n, t in tensors.items()}, Path(agent) / "model.safetensors",
              metadata={"format": "pt"})
    cfg = json.loads((Path(agent) / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (Path(agent) / "config.json").write_text(json.dumps(cfg, indent=2))
    return agent


# ---------------------------------------------------------------- numbers on a dtype's number line
# Independent of the library's step tables (merging.methods.steps): bit patterns, read as positions on the line.

_INT = {torch.bfloat16: (torch.int16, 16), torch.float16: (torch.int16, 16), torch.float32: (torch.int32, 32)}


def ordinals(t: torch.Tensor):
    """Each value's position on its dtype's number line (numpy int64): adjacent representable values differ by
    1, +0 and −0 are both 0."""
    import numpy as np

    itype, bits = _INT[t.dtype]
    raw = t.contiguous().view(itype).numpy().astype(np.int64) & ((1 << bits) - 1)
    mag = raw & ((1 << (bits - 1)) - 1)
    return np.where(raw >> (bits - 1) == 1, -mag, mag)


def from_ordinals(o, dtype: torch.dtype) -> torch.Tensor:
    """The values at positions `o` (numpy int64) of `dtype`'s number line (0 → +0)."""
    import numpy as np

    itype, bits = _INT[dtype]
    raw = np.where(o < 0, (1 << (bits - 1)) | -o, o)
    raw = np.where(raw >= 1 << (bits - 1), raw - (1 << bits), raw).astype(np.int16 if bits == 16 else np.int32)
    return torch.from_numpy(raw).view(dtype)


def step_at(base: torch.Tensor):
    """One representable step at each base weight (float64): from |w| to the next larger magnitude of its dtype."""
    o = abs(ordinals(base))
    return (from_ordinals(o + 1, base.dtype).double() - from_ordinals(o, base.dtype).double()).numpy()


def edge_base(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Random base weights in `dtype` with the awkward values mixed in: +0, −0, subnormals of either sign, exact
    powers of two (where a step toward zero is half a step), and a few large weights; no Inf, no NaN."""
    w = (torch.randn(shape, generator=g) * 0.02).to(dtype).reshape(-1)
    n = w.numel()
    pick = torch.randperm(n, generator=g)
    k = max(1, n // 40)
    w[pick[:k]] = 0.0
    w[pick[k:2 * k]] = -0.0
    sub = torch.randint(1, 40, (k,), generator=g).numpy()
    sign = torch.where(torch.rand(k, generator=g) < 0.5, -1, 1).numpy()
    w[pick[2 * k:3 * k]] = from_ordinals(sign * sub, dtype)  # the smallest subnormals, either sign
    powers = 2.0 ** torch.randint(-12, 0, (2 * k,), generator=g).float()
    w[pick[3 * k:5 * k]] = (powers * torch.where(torch.rand(2 * k, generator=g) < 0.5, -1.0, 1.0)).to(dtype)
    w[pick[5 * k:5 * k + 2]] = torch.tensor([1.5, -3.0]).to(dtype)
    return w.view(shape)


def edge_agent(base: torch.Tensor, density: float, g: torch.Generator) -> torch.Tensor:
    """An agent of `base` (same dtype) changed on a random `density` share: one step either way (across zero and
    binade edges too), two or three steps, and realistic random updates rounded to the dtype; −0 where the base
    holds +0 (the same value: no change)."""
    o = ordinals(base).reshape(-1)
    n = o.size
    moved = torch.rand(n, generator=g).numpy() < density
    kind = torch.randint(0, 4, (n,), generator=g).numpy()
    delta = torch.randint(1, 4, (n,), generator=g).numpy() * torch.where(torch.rand(n, generator=g) < 0.5, -1,
                                                                         1).numpy()
    delta = torch.where(torch.from_numpy(kind <= 1), torch.from_numpy(delta.clip(-1, 1)),
                        torch.from_numpy(delta)).numpy()
    out = from_ordinals(o + moved * delta, base.dtype).float()
    smooth = (base.reshape(-1).float() + torch.randn(n, generator=g) * 3e-4).to(base.dtype).float()
    out = torch.where(torch.from_numpy(moved & (kind == 3)), smooth, out).to(base.dtype)
    zeros = torch.from_numpy(o == 0) & (torch.rand(n, generator=g) < 0.5)
    out[zeros] = -0.0
    return out.view(base.shape)


EDGE_SHAPES = {"model.embed_tokens.weight": (40, 24), "model.layers.0.self_attn.q_proj.weight": (24, 24),
               "model.layers.0.mlp.up_proj.weight": (48, 24), "model.layers.1.input_layernorm.weight": (24,),
               "model.norm.weight": (24,)}


def write_plain_model(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """One safetensors file and a minimal config.json (enough for the analysis and the merge)."""
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}))
    return folder


def make_edge_family(root: Path, dtype: torch.dtype, n: int = 3, seed: int = 0,
                     norms: torch.dtype | None = None) -> tuple[Path, list[Path]]:
    """A base of `edge_base` tensors (norm tensors in `norms` when given) and n `edge_agent`s of rising density."""
    g = torch.Generator().manual_seed(seed)
    dt = {k: norms if norms is not None and "norm" in k else dtype for k in EDGE_SHAPES}
    base = {k: edge_base(s, dt[k], g) for k, s in EDGE_SHAPES.items()}
    agents = [{k: edge_agent(base[k], 0.2 + 0.25 * t, g) for k in EDGE_SHAPES} for t in range(n)]
    return (write_plain_model(root / "base", base),
            [write_plain_model(root / f"agent{t}", a) for t, a in enumerate(agents)])

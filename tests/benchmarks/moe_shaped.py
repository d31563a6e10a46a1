"""A synthetic MoE-shaped checkpoint set: Qwen3-MoE tensor names (every routed expert's gate, up and down
projection stored apart, a router per layer, attention and norms), tiny sizes, a bf16 base and agents whose RL-like
updates touch some experts and leave the others exactly as the base had them (routing).

    python -m tests.benchmarks.moe_shaped --layers 48 --experts 128 --out .bench/moe [--hidden 32 --inter 16]

48 layers × 128 experts × 3 projections = 18,432 expert tensors (Qwen3-30B-A3B's layout at toy width).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

AGENTS = ("a", "b", "c")


def moe_names(layers: int, experts: int, hidden: int, inter: int, vocab: int = 256) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of the MoE-shaped model, in a model's usual order."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        for proj in ("q", "k", "v", "o"):
            shapes[f"{p}self_attn.{proj}_proj.weight"] = (hidden, hidden)
        shapes[f"{p}input_layernorm.weight"] = (hidden,)
        shapes[f"{p}post_attention_layernorm.weight"] = (hidden,)
        shapes[f"{p}mlp.gate.weight"] = (experts, hidden)
        for e in range(experts):
            shapes[f"{p}mlp.experts.{e}.gate_proj.weight"] = (inter, hidden)
            shapes[f"{p}mlp.experts.{e}.up_proj.weight"] = (inter, hidden)
            shapes[f"{p}mlp.experts.{e}.down_proj.weight"] = (hidden, inter)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def make_moe(root: Path, layers: int, experts: int, hidden: int = 32, inter: int = 16, seed: int = 0) -> list[Path]:
    """Base + three agents (skipped when they exist): each agent changes about 40 % of the elements of the
    attention, the routers and a random half of the experts (a different half per agent), nothing else."""
    import torch
    from safetensors.torch import save_file

    folders = [root / n for n in ("base", *AGENTS)]
    if all((f / "model.safetensors").exists() for f in folders):
        return folders
    g = torch.Generator().manual_seed(seed)
    shapes = moe_names(layers, experts, hidden, inter)
    base = {n: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for n, s in shapes.items()}
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": hidden,
              "num_hidden_layers": layers, "num_experts": experts, "moe_intermediate_size": inter,
              "tie_word_embeddings": False}
    for k, folder in enumerate(folders):
        folder.mkdir(parents=True, exist_ok=True)
        tensors = base
        if k:
            used = torch.rand(layers, experts, generator=g) < 0.5
            tensors = {}
            for n, w in base.items():
                parts = n.split(".")
                if "experts" in parts and not used[int(parts[2]), int(parts[parts.index("experts") + 1])]:
                    tensors[n] = w
                    continue
                mask = torch.rand(w.shape, generator=g) < 0.4
                step = torch.randn(w.shape, generator=g) * 1e-3 * mask
                tensors[n] = (w.float() + step).to(torch.bfloat16)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config))
    return folders


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--inter", type=int, default=16)
    ap.add_argument("--out", default=".bench/moe")
    args = ap.parse_args(argv)
    folders = make_moe(Path(args.out), args.layers, args.experts, args.hidden, args.inter)
    print(" ".join(map(str, folders)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

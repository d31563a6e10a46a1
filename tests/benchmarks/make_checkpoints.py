"""Generate synthetic Qwen2.5-shaped bf16 checkpoints (a base and three RL-like agents) for benchmarks.

Usage: python -m tests.benchmarks.make_checkpoints --shape qwen2.5-1.5b --out DIR [--seed 0]
       [--shard-size 2GB] [--verify]

Writes DIR/base, DIR/agent_code, DIR/agent_tool, DIR/agent_memory, each with sharded
safetensors, model.safetensors.index.json and config.json, plus DIR/generation.json.
Everything is streamed chunk by chunk; memory stays at a few chunk-sized arrays.

Values: base ~ N(0, 0.02) (norm weights 1 + N(0, 0.02)). Where an agent's mask is set, its
bf16 value is moved by 1-2 bf16 ulps (up or down in magnitude); for |base| < 2^-8 the step is
widened to >= 2^-16 in value, and for |base| < 2^-13 the value jumps to [2^-13, 2^-12), so
every masked element has |agent - base| >= 1.5e-5 > eps = 1e-5 in float32 and every other
element is bit-identical. Real RL checkpoints in bf16 behave the same way: an update is only
visible when it moves the stored value by at least one ulp.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
import zlib

import numpy as np
import torch

from .shapes import SHAPES, ModelShape, hf_config, num_params, tensor_specs
from .sparsity import AGENTS, OverlapModel
from .st_writer import ShardPlan, StreamingCheckpointWriter, parse_size

CHUNK_ELEMS = 1 << 22  # fixed: changing it changes the generated values
WEIGHT_STD = 0.02
EPS = 1e-5


def chunk_rng(seed: int, name: str, chunk: int) -> np.random.Generator:
    """Independent generator per (seed, tensor name, chunk): order- and process-independent."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode()), chunk])))


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (nearest-even, via torch) and return the raw int16 bits."""
    return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy()


def nudged(base_bits: np.ndarray, rand_bits: np.ndarray) -> np.ndarray:
    """bf16 bits moved by a few ulps so that |new - old| >= 1.5e-5 (see module docstring)."""
    mag = base_bits & np.int16(0x7FFF)
    exp = mag >> 7
    shift = np.clip(np.int16(119) - exp, 0, 5).astype(np.int16)
    step = (np.int16(1) + (rand_bits & 1).astype(np.int16)) << shift
    down = (rand_bits & 2).astype(bool)
    moved = np.where(down, base_bits - step, base_bits + step).astype(np.int16)
    tiny = exp < 114
    if tiny.any():
        jumped = (base_bits & np.int16(-0x8000)) | np.int16(114 << 7) | (mag & np.int16(0x7F))
        moved = np.where(tiny, jumped, moved)
    return moved


def gen_chunk(seed: int, name: str, chunk: int, n: int, is_norm: bool,
              overlap: OverlapModel) -> tuple[np.ndarray, list[np.ndarray], list[int]]:
    """Base bits, agent bits and per-agent mask counts for one chunk of n elements."""
    g = chunk_rng(seed, name, chunk)
    x = g.standard_normal(n, dtype=np.float32)
    x *= WEIGHT_STD
    if is_norm:
        x += 1.0
    base = to_bf16_bits(x)
    del x
    region = g.integers(0, 65536, n, dtype=np.uint16)
    bits = g.integers(0, 65536, n, dtype=np.uint16)
    agents, counts = [], []
    for t, mask in enumerate(overlap.masks(region)):
        moved = nudged(base, bits >> np.uint16(2 * t))
        agents.append(np.where(mask, moved, base))
        counts.append(int(np.count_nonzero(mask)))
    return base, agents, counts


def true_stats(base: np.ndarray, agents: list[np.ndarray]) -> tuple[list[int], list[int]]:
    """Active and unique counts per agent, |agent - base| > eps computed in float32 from bf16."""
    b = torch.from_numpy(base).view(torch.bfloat16).float()
    act = [(torch.from_numpy(a).view(torch.bfloat16).float() - b).abs() > EPS for a in agents]
    c = act[0].to(torch.int8) + act[1].to(torch.int8) + act[2].to(torch.int8)
    one = c == 1
    return [int(m.sum()) for m in act], [int((m & one).sum()) for m in act]


def generate(shape: ModelShape, out: str, seed: int, shard_bytes: int, verify: bool) -> dict:
    """Write base + three agents under out; return a summary dict (also saved as generation.json)."""
    specs = tensor_specs(shape)
    plan = ShardPlan.build(specs, shard_bytes)
    overlap = OverlapModel.paper_like()
    roles = ("base",) + AGENTS
    tmp = {r: os.path.join(out, f"{r}.partial-gen") for r in roles}
    for path in tmp.values():
        shutil.rmtree(path, ignore_errors=True)
    writers = {r: StreamingCheckpointWriter(tmp[r], plan) for r in roles}
    masked = [0, 0, 0]
    active, unique = [0, 0, 0], [0, 0, 0]
    t0 = time.perf_counter()
    for name, dims in specs:
        for w in writers.values():
            w.begin_tensor(name)
        numel = int(np.prod(dims))
        row = int(np.prod(dims[1:])) if len(dims) > 1 else numel
        rows_per_chunk = max(1, CHUNK_ELEMS // row)
        for chunk, start in enumerate(range(0, numel, rows_per_chunk * row)):
            n = min(rows_per_chunk * row, numel - start)
            base, agents, counts = gen_chunk(seed, name, chunk, n, name.endswith("norm.weight"), overlap)
            writers["base"].write(memoryview(base))
            for role, a, k, i in zip(AGENTS, agents, counts, range(3)):
                writers[role].write(memoryview(a))
                masked[i] += k
            if verify:
                act, uni = true_stats(base, agents)
                for i in range(3):
                    active[i] += act[i]
                    unique[i] += uni[i]
    config = hf_config(shape)
    for role, w in writers.items():
        w.finish(config)
    for role, path in tmp.items():
        final = os.path.join(out, role)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(path, final)
    elapsed = time.perf_counter() - t0
    total = num_params(shape)
    summary = {
        "shape": shape.name, "seed": seed, "params_per_model": total,
        "bytes_per_model": total * 2, "shards": len(plan.shards), "seconds": round(elapsed, 2),
        "expected": overlap.expected(),
        "masked_density": {a: masked[i] / total for i, a in enumerate(AGENTS)},
    }
    if verify:
        summary["measured"] = {a: {"density": active[i] / total, "unique_fraction": unique[i] / max(active[i], 1)}
                               for i, a in enumerate(AGENTS)}
    with open(os.path.join(out, "generation.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def main(argv: list[str] | None = None) -> None:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-size", default="2GB")
    ap.add_argument("--verify", action="store_true", help="also measure true densities (slower)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    s = generate(SHAPES[args.shape], args.out, args.seed, parse_size(args.shard_size), args.verify)
    print(json.dumps(s, indent=2))
    print(f"generated 4 x {s['bytes_per_model'] / 1e9:.2f} GB in {s['seconds']:.1f} s")


if __name__ == "__main__":
    main()

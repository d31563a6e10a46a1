"""Generate synthetic Qwen2.5-shaped bf16 checkpoints (a base and three RL-like agents) for benchmarks.

Usage: python -m tests.benchmarks.make_checkpoints --shape qwen2.5-1.5b --out DIR [--seed 0]
       [--shard-size 2GB] [--verify] [--generator numpy|hash] [--device cpu|cuda]

Writes DIR/base, DIR/agent_code, DIR/agent_tool, DIR/agent_memory, each with sharded
safetensors, model.safetensors.index.json and config.json, plus DIR/generation.json.
Everything is streamed chunk by chunk; memory stays at a few chunk-sized arrays.

Values: base ~ N(0, 0.02) (norm weights 1 + N(0, 0.02)). Where an agent's mask is set, its
bf16 value is moved by 1-2 bf16 ulps (up or down in magnitude); for |base| < 2^-8 the step is
widened to >= 2^-16 in value, and for |base| < 2^-13 the value jumps to [2^-13, 2^-12), so
every masked element has |agent - base| >= 1.5e-5 > eps = 1e-5 in float32 and every other
element is bit-identical. Real RL checkpoints in bf16 behave the same way: an update is only
visible when it moves the stored value by at least one ulp.

Two generators with the same structure: `numpy` (the default; PCG64 streams per chunk, what the
0.5B/1.5B reference sets were made with) and `hash` (`--generator hash`, for the 7B shape: every
element's random bits are a counter-based hash of (seed, tensor, index), computed with torch on
`--device` (a GPU makes 4 × 15 GB in about the time it takes to write them); N(0, 0.02) is approximated
by a sum of four 16-bit uniforms, all in exact integer or single-rounding float32 steps, so the files
are the same whatever the device). Chunks are written by a second thread while the next is made.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import threading
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


_M1 = -4658895280553007687  # splitmix64 constants as signed int64 (see merging.methods.dare)
_M2 = -7723592293110705685


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser on int64 (wrapping), logical shifts done by masking."""
    x = (x ^ ((x >> 30) & ((1 << 34) - 1))) * _M1
    x = (x ^ ((x >> 27) & ((1 << 37) - 1))) * _M2
    return x ^ ((x >> 31) & ((1 << 33) - 1))


def _nudged_torch(base: torch.Tensor, rand: torch.Tensor) -> torch.Tensor:
    """`nudged` in torch on int32 copies of the int16 bit patterns (the same arithmetic)."""
    b = base.to(torch.int32)
    mag = b & 0x7FFF
    exp = mag >> 7
    shift = (119 - exp).clamp(0, 5)
    step = (1 + (rand & 1)) << shift
    moved = torch.where((rand & 2) != 0, b - step, b + step)
    jumped = (b & -0x8000) | (114 << 7) | (mag & 0x7F)
    return torch.where(exp < 114, jumped, moved).to(torch.int16)


def gen_chunk_hash(seed: int, name: str, offset: int, n: int, is_norm: bool, overlap: OverlapModel,
                   device: torch.device) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    """Like gen_chunk, from a counter-based hash of (seed, tensor, element index): int16 bit patterns on
    `device`, the same on every device and for every chunking."""
    key = (seed * 0x9E3779B97F4A7C15 + zlib.crc32(name.encode()) * 0xBF58476D1CE4E5B9) & ((1 << 62) - 1)
    idx = torch.arange(offset, offset + n, dtype=torch.int64, device=device) * 2
    h1 = _mix(idx + key)
    h2 = _mix(idx + 1 + key)
    u = [((h1 >> s) & 0xFFFF).to(torch.float32) for s in (0, 16, 32, 48)]
    irwin_hall = (u[0] + u[1]) + (u[2] + u[3])  # exact integers below 2^18
    z = (irwin_hall - 131070.0) * (1.0 / 37837.23)  # mean 0, variance ≈ 1 (4 · 65536² / 12)
    x = z * WEIGHT_STD
    if is_norm:
        x = x + 1.0
    base = x.to(torch.bfloat16).view(torch.int16)
    region = (h2 & 0xFFFF).to(torch.int32)
    bits = ((h2 >> 16) & 0xFFFF).to(torch.int32)
    b = overlap.bounds
    masks = (region < b[3],
             ((region >= b[0]) & (region < b[2])) | ((region >= b[4]) & (region < b[6])),
             (region >= b[1]) & (region < b[5]))
    agents, counts = [], []
    for t, mask in enumerate(masks):
        moved = _nudged_torch(base, bits >> (2 * t))
        agents.append(torch.where(mask, moved, base))
        counts.append(int(mask.sum()))
    return base, agents, counts


def true_stats(base: np.ndarray, agents: list[np.ndarray]) -> tuple[list[int], list[int]]:
    """Active and unique counts per agent, |agent - base| > eps computed in float32 from bf16."""
    b = torch.from_numpy(base).view(torch.bfloat16).float()
    act = [(torch.from_numpy(a).view(torch.bfloat16).float() - b).abs() > EPS for a in agents]
    c = act[0].to(torch.int8) + act[1].to(torch.int8) + act[2].to(torch.int8)
    one = c == 1
    return [int(m.sum()) for m in act], [int((m & one).sum()) for m in act]


def generate(shape: ModelShape, out: str, seed: int, shard_bytes: int, verify: bool, generator: str = "numpy",
             device: str = "cpu") -> dict:
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
    dev = torch.device(device)
    pending: queue.Queue = queue.Queue(maxsize=2)  # chunks made, waiting to be written

    def write_all() -> None:
        while (item := pending.get()) is not None:
            if item[0][0] == "begin":
                for w in writers.values():
                    w.begin_tensor(item[0][1])
                continue
            for role, data in item:
                writers[role].write(memoryview(data))

    writer = threading.Thread(target=write_all, name="gen-writer")
    writer.start()
    try:
        for name, dims in specs:
            numel = int(np.prod(dims))
            row = int(np.prod(dims[1:])) if len(dims) > 1 else numel
            step = CHUNK_ELEMS if generator == "numpy" else 1 << 24
            rows_per_chunk = max(1, step // row)
            pending.put([("begin", name)])
            for chunk, start in enumerate(range(0, numel, rows_per_chunk * row)):
                n = min(rows_per_chunk * row, numel - start)
                if generator == "numpy":
                    base, agents, counts = gen_chunk(seed, name, chunk, n, name.endswith("norm.weight"), overlap)
                else:
                    tb, tas, counts = gen_chunk_hash(seed, name, start, n, name.endswith("norm.weight"), overlap, dev)
                    base, agents = tb.cpu().numpy(), [a.cpu().numpy() for a in tas]
                pending.put([("base", base)] + list(zip(AGENTS, agents)))
                for i, k in enumerate(counts):
                    masked[i] += k
                if verify:
                    act, uni = true_stats(base, agents)
                    for i in range(3):
                        active[i] += act[i]
                        unique[i] += uni[i]
    finally:
        pending.put(None)
        writer.join()
    config = hf_config(shape)
    for w in writers.values():
        w.finish(config)
    for role, path in tmp.items():
        final = os.path.join(out, role)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(path, final)
    elapsed = time.perf_counter() - t0
    total = num_params(shape)
    summary = {
        "shape": shape.name, "seed": seed, "generator": generator, "params_per_model": total,
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
    ap.add_argument("--generator", choices=["numpy", "hash"], default=None,
                    help="numpy (default below 7B: the reference sets) or hash (default for 7B: fast, any device)")
    ap.add_argument("--device", default="cpu", help="torch device for --generator hash (cuda on a GPU machine)")
    args = ap.parse_args(argv)
    generator = args.generator or ("hash" if args.shape == "qwen2.5-7b" else "numpy")
    if generator == "numpy":
        torch.set_num_threads(1)
    s = generate(SHAPES[args.shape], args.out, args.seed, parse_size(args.shard_size), args.verify, generator,
                 args.device)
    print(json.dumps(s, indent=2))
    print(f"generated 4 x {s['bytes_per_model'] / 1e9:.2f} GB in {s['seconds']:.1f} s")


if __name__ == "__main__":
    main()

"""Tiny float32 reference RAM / RAM+ (paper Eq. 1-7, per-tensor rho) to validate the compare path.

Usage: python -m tests.benchmarks.reference_merge DATA_DIR OUT_DIR [--plus] [--r 0.1] [--alpha 0.2]
Whole tensors in memory: meant for the `tiny` shapes only, not for benchmarking.
Written from the paper's equations; the unique_t = 0 guard (rho = shared / max(unique, eps))
mirrors the behaviour documented for mergekit's ramplus_tl so the two can be compared.
"""

from __future__ import annotations

import argparse
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .floor import shard_files
from .sparsity import AGENTS


def ram_tensor(base: torch.Tensor, agents: list[torch.Tensor], plus: bool, r: float, alpha: float,
               eps: float) -> torch.Tensor:
    """Merge one tensor in float32: mean where >= 2 agents are active, lambda_t * tau_t where one is."""
    taus = torch.stack([a.float() - base.float() for a in agents])
    active = taus.abs() > eps
    count = active.sum(0)
    shared_sum = torch.where(active & (count >= 2), taus, 0).sum(0) / count.clamp_min(1)
    lam = torch.ones(len(agents))
    if plus:
        for t in range(len(agents)):
            shared = int((active[t] & (count >= 2)).sum())
            unique = int((active[t] & (count == 1)).sum())
            lam[t] = 1 + r * min(max(shared / max(unique, eps), 0.0), alpha)
    unique_sum = (torch.where(active & (count == 1), taus, 0) * lam.view(-1, *[1] * base.dim())).sum(0)
    return base.float() + shared_sum + unique_sum


def merge_dir(data_dir: str, out_dir: str, plus: bool, r: float = 0.1, alpha: float = 0.2,
              eps: float = 1e-5) -> None:
    """Merge base + the three agents of data_dir into out_dir/model.safetensors (float32)."""
    files = {role: shard_files(os.path.join(data_dir, role)) for role in ("base",) + AGENTS}
    out: dict[str, torch.Tensor] = {}
    names: list[str] = []
    for path in files["base"]:
        with safe_open(path, "pt") as f:
            names += list(f.keys())
    for name in names:
        loaded = []
        for role in ("base",) + AGENTS:
            for path in files[role]:
                with safe_open(path, "pt") as f:
                    if name in f.keys():
                        loaded.append(f.get_tensor(name))
        out[name] = ram_tensor(loaded[0], loaded[1:], plus, r, alpha, eps).contiguous()
    os.makedirs(out_dir, exist_ok=True)
    save_file(out, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> None:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--plus", action="store_true")
    ap.add_argument("--r", type=float, default=0.1)
    ap.add_argument("--alpha", type=float, default=0.2)
    args = ap.parse_args(argv)
    merge_dir(args.data_dir, args.out_dir, args.plus, args.r, args.alpha)


if __name__ == "__main__":
    main()

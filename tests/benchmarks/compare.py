"""Streamed per-tensor comparison of two merged checkpoints (cross-implementation correctness).

Usage: python -m tests.benchmarks.compare DIR_A DIR_B [--json OUT]
Tensors are read in row chunks and compared in float32; whole models are never loaded.
An element "differs" when |a - b| > REL_TOL * max(|a|, |b|) + ABS_TOL, i.e. beyond a few float32
rounding steps (the two implementations may order additions and divisions differently).
"""

from __future__ import annotations

import argparse
import json
import os
from contextlib import ExitStack
from typing import Any

import torch
from safetensors import safe_open

from .floor import shard_files

REL_TOL = 4 * torch.finfo(torch.float32).eps  # four float32 ulps of the larger value
ABS_TOL = 1e-12
CHUNK_ELEMS = 1 << 22


def tensor_locations(model_dir: str) -> dict[str, str]:
    """tensor name -> shard path for a checkpoint folder."""
    out: dict[str, str] = {}
    for path in shard_files(model_dir):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                out[name] = path
    return out


def compare_dirs(dir_a: str, dir_b: str, chunk_elems: int = CHUNK_ELEMS) -> dict[str, Any]:
    """Per-tensor max |a-b|, max relative diff and fraction of differing elements, plus totals."""
    loc_a, loc_b = tensor_locations(dir_a), tensor_locations(dir_b)
    names = sorted(set(loc_a) & set(loc_b))
    per: dict[str, dict[str, Any]] = {}
    tot_n = tot_bad = 0
    worst = 0.0
    with ExitStack() as stack:
        handles: dict[str, Any] = {}

        def h(path: str) -> Any:
            if path not in handles:
                handles[path] = stack.enter_context(safe_open(path, framework="pt"))
            return handles[path]

        for name in names:
            sa, sb = h(loc_a[name]).get_slice(name), h(loc_b[name]).get_slice(name)
            shape = sa.get_shape()
            if shape != sb.get_shape():
                per[name] = {"error": f"shape {shape} vs {sb.get_shape()}"}
                continue
            row = 1
            for d in shape[1:]:
                row *= d
            rows = max(1, chunk_elems // max(row, 1))
            n_rows = shape[0] if shape else 1
            max_abs = max_rel = 0.0
            n = bad = 0
            for start in range(0, n_rows, rows):
                if shape:
                    a, b = sa[start:start + rows].float(), sb[start:start + rows].float()
                else:
                    a, b = h(loc_a[name]).get_tensor(name).float(), h(loc_b[name]).get_tensor(name).float()
                d = (a - b).abs()
                scale = torch.maximum(a.abs(), b.abs())
                beyond = d > scale * REL_TOL + ABS_TOL
                n += d.numel()
                bad += int(beyond.sum())
                if d.numel():
                    max_abs = max(max_abs, float(d.max()))
                    max_rel = max(max_rel, float((d / scale.clamp_min(1e-30)).max()))
            per[name] = {"n": n, "max_abs": max_abs, "max_rel": max_rel, "frac_differing": bad / max(n, 1)}
            tot_n += n
            tot_bad += bad
            worst = max(worst, max_abs)
    return {
        "a": os.path.abspath(dir_a), "b": os.path.abspath(dir_b),
        "only_in_a": sorted(set(loc_a) - set(loc_b)), "only_in_b": sorted(set(loc_b) - set(loc_a)),
        "elements": tot_n, "max_abs": worst, "frac_differing": tot_bad / max(tot_n, 1),
        "tensors_differing": sum(1 for v in per.values() if v.get("frac_differing", 1) > 0),
        "per_tensor": per,
    }


def main(argv: list[str] | None = None) -> None:
    """CLI: print the summary (without per-tensor rows unless --json is given)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir_a")
    ap.add_argument("dir_b")
    ap.add_argument("--json", help="write the full per-tensor report here")
    args = ap.parse_args(argv)
    res = compare_dirs(args.dir_a, args.dir_b)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    print(json.dumps({k: v for k, v in res.items() if k != "per_tensor"}, indent=2))


if __name__ == "__main__":
    main()

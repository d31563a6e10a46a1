"""Read floor F: read every tensor of the given checkpoints once and convert it to float32.

Usage: python -m tests.benchmarks.floor MODEL_DIR [MODEL_DIR ...]
A streaming merge cannot be faster than this, so merge times are reported as multiples of it.
Large tensors are read in row chunks so memory stays bounded (about CHUNK_ELEMS float32 values).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import torch
from safetensors import safe_open

CHUNK_ELEMS = 1 << 24  # 64 MiB of float32 per chunk


def shard_files(model_dir: str) -> list[str]:
    """Safetensors files of a checkpoint folder (from the index when there is one)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(model_dir, n) for n in names]
    return sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))


def read_floor(model_dirs: list[str], chunk_elems: int = CHUNK_ELEMS) -> dict[str, float]:
    """Read and upcast every tensor once; return element count, seconds and a checksum."""
    t0 = time.perf_counter()
    elems, checksum = 0, 0.0
    for model_dir in model_dirs:
        for path in shard_files(model_dir):
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    shape = sl.get_shape()
                    row = 1
                    for d in shape[1:]:
                        row *= d
                    rows = max(1, chunk_elems // max(row, 1))
                    n_rows = shape[0] if shape else 1
                    if not shape or n_rows <= rows:
                        x = f.get_tensor(name).float()
                        elems += x.numel()
                        checksum += float(x.view(-1)[:1].sum()) if x.numel() else 0.0
                        continue
                    for start in range(0, n_rows, rows):
                        x = sl[start:start + rows].float()
                        elems += x.numel()
                        checksum += float(x.view(-1)[0])
                    del x
    return {"elements": elems, "seconds": time.perf_counter() - t0, "checksum": checksum}


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: prints a JSON line with the timing."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dirs", nargs="+")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    res = read_floor(args.model_dirs)
    res["gb_read"] = res["elements"] * 2 / 1e9
    print(json.dumps(res))


if __name__ == "__main__":
    main()

"""mergekit 0.1.5 configs (ram, ramplus_tl, ties, task_arithmetic) for the generated checkpoints.

Usage: python -m tests.benchmarks.mergekit_configs DATA_DIR METHOD [--float32] > merge.yaml
JSON is valid YAML, so configs are written as JSON and the project needs no YAML library.
mergekit is a benchmark reference only; it lives in .bench/mergekit-venv, never in the project.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .sparsity import AGENTS

METHODS = ("ram", "ramplus_tl", "ties", "task_arithmetic")
MERGEKIT_VENV = os.path.join(os.path.dirname(__file__), "..", "..", ".bench", "mergekit-venv")


def mergekit_config(data_dir: str, method: str, float32: bool = False,
                    ta_lambda: float = 1.0, **overrides: Any) -> dict[str, Any]:
    """Config dict for `mergekit-yaml`; float32=True computes and writes in float32."""
    base = os.path.abspath(os.path.join(data_dir, "base"))
    agents = [os.path.abspath(os.path.join(data_dir, a)) for a in AGENTS]
    per_model: dict[str, Any] = {}
    params: dict[str, Any]
    if method == "ram":
        params = {"epsilon": 1e-5}
    elif method == "ramplus_tl":
        params = {"r": 0.1, "alpha": 0.2, "epsilon": 1e-5}  # mergekit defaults, spelled out
    elif method == "ties":
        per_model = {"weight": 1.0, "density": 0.5}
        params = {"lambda": 1.0, "normalize": True}
    elif method == "task_arithmetic":
        per_model = {"weight": 1.0}
        params = {"lambda": ta_lambda, "normalize": False}
    else:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    params.update(overrides)
    cfg: dict[str, Any] = {
        "merge_method": method,
        "base_model": base,
        "models": [{"model": a, **({"parameters": dict(per_model)} if per_model else {})} for a in agents],
        "parameters": params,
        "dtype": "float32" if float32 else "bfloat16",
    }
    cfg["out_dtype"] = "float32" if float32 else "bfloat16"
    return cfg


def write_config(path: str, cfg: dict[str, Any]) -> str:
    """Write cfg as YAML-compatible JSON to path and return the path."""
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


def mergekit_command(config_path: str, out_dir: str, venv: str = MERGEKIT_VENV,
                     shard_size: str | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    """argv for mergekit-yaml on CPU: lazy unpickle, no tokenizer copy (inputs have none), no card.

    shard_size None keeps mergekit's default ("5B"; compared with bytes, and the current output
    shard is held in RAM until it is flushed, so it bounds mergekit's output buffer).
    """
    exe = os.path.abspath(os.path.join(venv, "bin", "mergekit-yaml"))
    argv = [exe, config_path, out_dir, "--lazy-unpickle", "--no-copy-tokenizer",
            "--no-write-model-card", "--quiet"]
    if shard_size:
        argv += ["--out-shard-size", shard_size]
    return argv + list(extra)


def main(argv: list[str] | None = None) -> None:
    """Print a config to stdout."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir")
    ap.add_argument("method", choices=METHODS)
    ap.add_argument("--float32", action="store_true")
    ap.add_argument("--ta-lambda", type=float, default=1.0)
    args = ap.parse_args(argv)
    print(json.dumps(mergekit_config(args.data_dir, args.method, args.float32, args.ta_lambda), indent=2))


if __name__ == "__main__":
    main()

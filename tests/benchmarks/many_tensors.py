"""Per-tensor overhead: analyze (and merge) a model made of very many tiny tensors (a review found
100,000 tensors of 30 elements, 24 MB of weights, took 100 s and 2.1 GB to analyze).

    python -m tests.benchmarks.many_tensors [--tensors 100000] [--elems 30] [--out .bench/many-tensors]
                                            [--compare OTHER_CHECKOUT] [--merge]

Writes a bf16 base and three agents (40 % of each tensor changed), then times `ram-studio analyze --no-cache`
(and with --merge `merge --method ram`) in a fresh process: wall time, user + system CPU time and peak
resident memory (from wait4). `--compare` runs the same commands with another checkout first on PYTHONPATH
(e.g. a `git worktree` of an older commit), one after the other, so both numbers come from one run.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_models(root: Path, tensors: int, elems: int) -> list[Path]:
    """Base + three agents, one safetensors file each (skipped when they already exist)."""
    import torch
    from safetensors.torch import save_file

    folders = [root / n for n in ("base", "a", "b", "c")]
    if all((f / "model.safetensors").exists() for f in folders):
        return folders
    g = torch.Generator().manual_seed(0)
    base = {f"model.layers.{i // 10}.mlp.p{i % 10}.weight": torch.randn(elems, generator=g) for i in range(tensors)}
    for k, folder in enumerate(folders):
        folder.mkdir(parents=True, exist_ok=True)
        t = base if k == 0 else {n: v + torch.randn(elems, generator=g) * 0.05 * (torch.rand(elems, generator=g) < 0.4)
                                 for n, v in base.items()}
        save_file({n: v.to(torch.bfloat16) for n, v in t.items()}, folder / "model.safetensors",
                  metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    return folders


def timed(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run a command; its wall time, CPU time and peak RSS (of that child alone)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({code}): {proc.stderr.read()[-2000:]}")
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=100_000)
    ap.add_argument("--elems", type=int, default=30)
    ap.add_argument("--out", default=".bench/many-tensors")
    ap.add_argument("--compare", help="another checkout to time the same way (first on PYTHONPATH)")
    ap.add_argument("--merge", action="store_true", help="also time `merge --method ram`")
    args = ap.parse_args(argv)
    models = make_models(Path(args.out) / f"{args.tensors}x{args.elems}", args.tensors, args.elems)
    trees = ([("compare", args.compare)] if args.compare else []) + [("this checkout", None)]
    results = {}
    for label, tree in trees:
        env = {**os.environ, "RAM_STUDIO_CACHE": tempfile.mkdtemp(prefix="many-tensors-cache-")}
        if tree:
            env["PYTHONPATH"] = str(Path(tree).resolve())
        cmd = [sys.executable, "-m", "ram_studio"]
        row = {"analyze": timed([*cmd, "analyze", *map(str, models), "--quiet", "--no-cache"], env)}
        if args.merge:
            out = Path(tempfile.mkdtemp(prefix="many-tensors-out-")) / "merged"
            row["merge ram"] = timed([*cmd, "merge", *map(str, models), "--method", "ram", "--out", str(out),
                                      "--quiet"], env)
        results[label] = row
        print(f"{label}: {json.dumps(row)}", flush=True)
    load = os.getloadavg()
    print(f"{args.tensors:,} tensors × {args.elems} elements, 4 models; load average {load[0]:.1f} "
          f"(this machine has {os.cpu_count()} cores; {resource.getpagesize()} B pages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

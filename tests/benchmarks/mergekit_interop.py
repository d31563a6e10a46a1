"""Our run of a mergekit YAML against mergekit 0.1.5's own output on the same tiny models.

Usage: bash tests/benchmarks/setup_mergekit.sh   # once: mergekit 0.1.5 in its own venv (.bench/)
       python -m tests.benchmarks.mergekit_interop [--out .bench/interop]

A tiny float32 Qwen2 base and three agents with dense random float32 updates (so TIES has no ties at its
top-k threshold, which the two tools break differently); one config per method both tools have, each
with `dtype: float32` and `out_dtype: float32` so both compute and write float32; mergekit runs the
config with `mergekit-yaml`, we run it with `ram-studio run`. Every element must agree within float32
rounding of the computation: |a − b| ≤ 4 float32 ulps of the largest input magnitude at that element
(max of |θ0| and every |θ_t|). Ulps of the *result* would be the wrong yardstick where θ0 + τ_m cancels
(θ0 ≈ −τ_m): there mergekit's "divide each term, then sum" and our "sum, then divide" differ by one ulp of
the inputs, which is many ulps of the small result. Exits 1 if any method does not agree.
Not collected by pytest (it needs mergekit's separate venv); the results are in RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from tests.factory import make_agent, make_base, state

ROOT = Path(__file__).resolve().parents[2]
MERGEKIT = ROOT / ".bench" / "mergekit-venv" / "bin" / "mergekit-yaml"
CONFIGS = {
    "task_arithmetic": ({"lambda": 0.7}, {"weight": 1.0}),
    "ties": ({"lambda": 0.9, "normalize": True}, {"weight": 1.0, "density": 0.3}),
    "ram": ({"epsilon": 1e-5}, None),
    "ramplus_tl": ({"epsilon": 1e-5, "r": 0.1, "alpha": 0.2}, None),
    "ramplus_tl-paper-alpha": ({"epsilon": 1e-5, "r": 0.1, "alpha": 2.0}, None),
}


def make_models(root: Path) -> tuple[Path, list[Path]]:
    """A float32 base and agents whose sparse updates overlap partly (densities as in the paper's trio)."""
    base = make_base(root / "base", shard=None, dtype=torch.float32)
    agents = [make_agent(base, root / f"agent{i}", d, seed=200 + i, scale=0.01)
              for i, d in enumerate((0.05, 0.45, 0.55))]
    return base, agents


def compare(theirs: Path, ours: Path, base: Path, agents: list[Path]) -> dict:
    """Element-wise agreement of two merged float32 models of tiny inputs (whole tensors in memory)."""
    a, b, b0 = state(theirs), state(ours), state(base)
    ags = [state(x) for x in agents]
    n = bad = same = 0
    worst = 0.0
    for name in b0:
        x, y = a[name].float().reshape(-1), b[name].float().reshape(-1)
        scale = torch.stack([b0[name].float().reshape(-1).abs()]
                            + [g[name].float().reshape(-1).abs() for g in ags]).amax(0)
        d = (x - y).abs()
        bad += int((d > 4 * torch.finfo(torch.float32).eps * scale + 1e-12).sum())
        same += int((x.view(torch.int32) == y.view(torch.int32)).sum())
        n += d.numel()
        worst = max(worst, float(d.max()) if d.numel() else 0.0)
    match = set(a) == set(b) == set(b0) and bad == 0
    return {"elements": n, "max_abs_diff": worst, "beyond_4_ulps": bad / n, "identical_elements": same / n,
            "match": match}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".bench" / "interop")
    args = ap.parse_args(argv)
    if not MERGEKIT.exists():
        print(f"mergekit is not installed at {MERGEKIT}: run bash tests/benchmarks/setup_mergekit.sh", file=sys.stderr)
        return 2
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    base, agents = make_models(args.out / "models")
    rows, ok = [], True
    for name, (params, per_model) in CONFIGS.items():
        method = name.split("-")[0]
        doc = {"merge_method": method, "base_model": str(base),
               "models": [{"model": str(a), **({"parameters": per_model} if per_model else {})} for a in agents],
               "parameters": params, "dtype": "float32", "out_dtype": "float32"}
        cfg = args.out / f"{name}.yml"
        cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
        theirs, ours = args.out / f"{name}-mergekit", args.out / f"{name}-ram-studio"
        t0 = time.perf_counter()
        subprocess.run([str(MERGEKIT), str(cfg), str(theirs), "--allow-crimes"], check=True,
                       capture_output=True, text=True)
        t1 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ram_studio", "run", str(cfg), "--out", str(ours), "--quiet"],
                       check=True, cwd=ROOT)
        t2 = time.perf_counter()
        d = compare(theirs, ours, base, agents)
        ok &= d["match"]
        rows.append({"config": name, **d, "mergekit_s": round(t1 - t0, 2), "ram_studio_s": round(t2 - t1, 2)})
    print("| config | elements | bit-identical | max abs diff | beyond 4 ulps | match | mergekit s | ram-studio s |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r['config']} | {r['elements']:,} | {100 * r['identical_elements']:.2f} % | "
              f"{r['max_abs_diff']:.3g} | {r['beyond_4_ulps']:.3g} | "
              f"{'yes' if r['match'] else 'NO'} | {r['mergekit_s']} | {r['ram_studio_s']} |")
    print("(max abs diff over all elements; 'beyond 4 ulps' counts elements farther apart than 4 float32 ulps of "
          "the largest input magnitude there; identical_elements is the share that is bit-identical)")
    (args.out / "interop.json").write_text(json.dumps(rows, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

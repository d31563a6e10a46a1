"""SHA-256 of every merge and analysis of the 0.5B reference set and the demo trios, through the CLI.

Usage: python -m tests.benchmarks.bit_identity OUT.json [--set05b DIR] [--only demo|0.5b]
Run it on two checkouts (e.g. before and after a refactor) and compare the JSON files: a refactor that
changes no behaviour leaves every hash equal. Each merge runs on the fused-kernel path and, for the demo,
also on the torch path (RAM_STUDIO_KERNELS=torch); every file of the output folder is hashed (the card and
recipe name the output folder by its name, the same in every run; the demo's folder in text documents is
replaced by <DEMO>); the analysis JSON is hashed without its wall time and its cache key (which hashes folder
paths and mtimes).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Every registered method, with the settings that take different code paths (global vs tensor ρ, soft rule).
CASES = {
    "ram": ["--method", "ram"],
    "ram_plus": ["--method", "ram_plus"],
    "ram_plus_tensor": ["--method", "ram_plus", "--rho-scope", "tensor", "--alpha", "0.2"],
    "ram_plus_soft": ["--method", "ram_plus_soft", "--r", "0.2"],
    "task_arithmetic": ["--method", "task_arithmetic", "--lambda", "0.7"],
    "average": ["--method", "average"],
    "ties": ["--method", "ties", "--density", "0.3"],
    "dare_ta": ["--method", "dare_ta", "--drop-rate", "0.4"],
    "dare_ties": ["--method", "dare_ties", "--drop-rate", "0.6", "--seed", "3"],
    "unique_only": ["--method", "unique_only", "--agent", "1", "--dilute"],
}


ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "assets" / "demo")  # where demo:NAME models live: named by absolute path in side documents
TEXT = (".md", ".yaml", ".json")  # side documents that name the demo's folders by their absolute path


def sha(path: Path) -> str:
    """SHA-256 of a file; in text documents the demo's folder is replaced by <DEMO> first, so that two checkouts in
    different folders can be compared (other paths, e.g. a model set's, are left as they are)."""
    h = hashlib.sha256()
    if path.suffix in TEXT and path.stat().st_size < 1 << 24:
        h.update(path.read_bytes().replace(DEMO.encode(), b"<DEMO>"))
        return h.hexdigest()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def run(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "ram_studio", *args, "--quiet"], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")


def model_sets(set05b: str | None, only: str | None) -> dict[str, list[str]]:
    sets = {"demo": ["demo:base", "demo:code", "demo:tool", "demo:memory"],
            "demo-shared": ["demo-shared:base", "demo-shared:code", "demo-shared:tool", "demo-shared:memory"]}
    if set05b:
        sets["0.5b"] = [os.path.join(set05b, d) for d in ("base", "agent_code", "agent_tool", "agent_memory")]
    if only:
        sets = {k: v for k, v in sets.items() if k.startswith(only)}
    return sets


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--set05b", default=None, help="folder with base/ and agent_{code,tool,memory}/")
    ap.add_argument("--only", default=None)
    ap.add_argument("--analysis-only", action="store_true", help="skip the merges")
    a = ap.parse_args(argv)
    results: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="ram-bitid-") as tmp:
        for set_name, models in model_sets(a.set05b, a.only).items():
            paths = ["kernels", "torch"] if set_name.startswith("demo") else ["kernels"]
            for path in ([] if a.analysis_only else paths):
                env = dict(os.environ, RAM_STUDIO_CACHE=os.path.join(tmp, "cache"))
                if path == "torch":
                    env["RAM_STUDIO_KERNELS"] = "torch"
                for case, flags in CASES.items():
                    out = Path(tmp) / f"{set_name}-{path}-{case}"
                    t = time.perf_counter()
                    run(["merge", *models, *flags, "--out", str(out)], env)
                    results[f"{set_name}/{path}/{case}"] = {
                        f.name: sha(f) for f in sorted(out.iterdir())}
                    print(f"{set_name}/{path}/{case}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
            js = Path(tmp) / f"{set_name}-analysis.json"
            run(["analyze", *models, "--no-cache", "--json", str(js)], dict(os.environ))
            stats = json.loads(js.read_text())
            stats.pop("seconds", None)  # wall time
            stats.pop("fingerprint", None)  # the cache key: hashes the inputs' folder paths and mtimes
            results[f"{set_name}/analysis"] = {
                "analysis.json": hashlib.sha256(json.dumps(stats, sort_keys=True).replace(DEMO, "<DEMO>")
                                                .encode()).hexdigest()}
    Path(a.out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

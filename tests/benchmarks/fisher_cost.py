"""What the Fisher pass costs: wall time and peak memory of one agent's diagonal Fisher, as a Fisher merge or sweep
computes it (evaluation.fisher.ensure_fishers: the agent loaded by the demo evaluator, one example at a time, each
N's Fisher written to a fresh analysis cache), on the CPU.

    python -m tests.benchmarks.fisher_cost [--cases demo,0.5b] [--out FILE]

Cases (each in its own Python process, so that its peak resident memory is its own):
- `demo`: the bundled demo's agents (676 KB models), each on its own task's train split, N = 256 examples with
  answers sampled from the agent (the method's default rule) and with reference answers. The pass's time grows
  linearly in N (one example at a time; the mini Table 1's sweep records its own to N = 2048 in each Fisher's
  sidecar), its memory does not.
- `0.5b`: a Qwen2ForCausalLM of Qwen2.5-0.5B's shape (tests/benchmarks/shapes.py), random weights, stored in
  bfloat16, with the demo's character tokenizer (so the demo's tasks can be written for it), built once into
  .bench/fisher-0.5b; the `code` task (answers of at most 8 tokens) and the `tool` task (at most 96), a few
  examples, reference and sampled answers. Random weights rarely end an answer, so a sampled answer runs to the
  task's budget: the slow end of what a trained model costs.

Reported per case: the pass's compute seconds to each N (answers and gradients; the sidecar's `seconds`), the
seconds loading the agent, the whole call's wall time, the process's resident memory after imports and its peak
(VmHWM), and the machine's load average before and after. Timings on a shared machine are noisy: read the load.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / ".bench"
DEMO = ROOT / "assets" / "demo" / "models"

# (name, model folder or "0.5b", agent, task, rule, snapshots)
CASES = {
    "demo": [("demo", "demo", a, a, rule, [256]) for rule in ("sampled", "reference")
             for a in ("code", "tool", "memory")],
    "0.5b": [("0.5b", "0.5b", "agent", task, rule, [n])
             for task, n in (("code", 4), ("tool", 2)) for rule in ("reference", "sampled")],
}


def _status(field: str) -> float:
    """A field of /proc/self/status in MB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def build_05b(folder: Path) -> Path:
    """A Qwen2.5-0.5B-shaped Qwen2ForCausalLM (random weights, seed 0, bfloat16) with the demo's tokenizer."""
    if (folder / "model.safetensors").is_file():
        return folder
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from demo.modeling import build_tokenizer, generation_config
    from tests.benchmarks.shapes import SHAPES, hf_config

    tok = build_tokenizer("char")
    cfg = hf_config(SHAPES["qwen2.5-0.5b"])
    cfg.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**cfg)).to(torch.bfloat16)
    model.generation_config = generation_config()
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".fisher-0.5b-"))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(folder)
    return folder


def one(model: str, agent: str, task: str, rule: str, ns: list[int]) -> dict:
    """One agent's Fisher pass in this process, into a fresh cache; what it cost."""
    import torch

    from demo.evaluate import suite_of_folder
    from demo.evaluator import DemoEvaluator
    from evaluation.fisher import FisherPlan, agent_prints, ensure_fishers
    from merging.reading.checkpoint import open_checkpoint

    folder = DEMO / agent if model == "demo" else BENCH / "fisher-0.5b"
    base_folder = DEMO / "base" if model == "demo" else folder
    rss_imports = _status("VmRSS")
    base, ag = open_checkpoint(base_folder), open_checkpoint(folder)
    ev = DemoEvaluator(suite=suite_of_folder(base_folder))
    t0 = time.perf_counter()
    found = ensure_fishers(ev, base, [ag], agent_prints([ag]), FisherPlan((task,), rule, tuple(ns)),
                           device=torch.device("cpu"))[0]
    wall = time.perf_counter() - t0
    side = found[max(ns)].sidecar
    return {"model": model, "agent": agent, "task": task, "rule": rule, "threads": torch.get_num_threads(),
            "seconds_to_n": {n: f.sidecar["seconds"] for n, f in sorted(found.items())},
            "load_seconds": side["load_seconds"], "call_wall_s": round(wall, 3),
            "answer_tokens_mean": side["answer_tokens_mean"], "empty_answers": side["empty_answers"],
            "fisher_file_mb": round(found[max(ns)].path.stat().st_size / 2**20, 2),
            "rss_after_imports_mb": round(rss_imports, 1), "peak_rss_mb": round(_status("VmHWM"), 1)}


def run_case(case: tuple, env: dict[str, str]) -> dict:
    """A case in a fresh process with a fresh analysis cache."""
    _, model, agent, task, rule, ns = case
    with tempfile.TemporaryDirectory(prefix="fisher-cost-") as tmp:
        argv = [sys.executable, "-m", "tests.benchmarks.fisher_cost", "--one",
                json.dumps([model, agent, task, rule, ns])]
        load = os.getloadavg()
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env={**env, "RAM_STUDIO_CACHE": tmp}, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"case": list(case[1:]), "rc": proc.returncode, "stderr": proc.stderr[-2000:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**out, "process_wall_s": round(wall, 2), "load_before": [round(x, 2) for x in load],
            "load_after": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.fisher_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="demo,0.5b", help="comma-separated: demo, 0.5b")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(*json.loads(args.one))))
        return 0
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    if "0.5b" in chosen:
        BENCH.mkdir(exist_ok=True)
        build_05b(BENCH / "fisher-0.5b")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    doc = {"commit": commit, "python": platform.python_version(), "cpus": os.cpu_count(),
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "runs": []}
    for name in chosen:
        for case in CASES[name]:
            res = run_case(case, env)
            doc["runs"].append(res)
            print(json.dumps(res), flush=True)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark runner: our CLI vs mergekit 0.1.5 vs the read floor F on synthetic checkpoints.

Usage: python -m tests.benchmarks.run_benchmark [--shape qwen2.5-0.5b] [--only ram,ties,...]
       [--device auto|cpu|cuda] [--skip-mergekit] [--skip-ours] [--skip-check] [--keep-data] [--keep-outputs]
Each command runs as a subprocess; wall time and peak VmRSS / RssAnon of its process tree are
sampled from /proc. Times are reported as multiples of F and, per method, of mergekit's time.
Every merge of ours is cold (its own empty analysis cache: ram_plus includes its global-ρ counting
pass); `ram_plus (analysis cached)` reuses the cold `analyze` row's cache. `startup` measures when our
CLI reads its first tensor byte against `python -c "import torch"`. With `--device cuda` our commands
run with `--device cuda` and mergekit with `--cuda`; the results name the device.
Output folders are deleted right after measuring. Inputs the runner generated itself are deleted
at the end unless --keep-data; inputs that already existed are never touched.
Caveat: the machine may be shared; repeat runs and treat single numbers as noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .compare import compare_dirs
from .mergekit_configs import (
    MERGEKIT_VENV,
    mergekit_command,
    mergekit_config,
    write_config,
)
from .procmon import run_measured
from .sparsity import AGENTS

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BENCH = os.path.join(REPO, ".bench")

# our method name -> (extra CLI args, mergekit method compared against or None)
OUR_METHODS: dict[str, tuple[list[str], Optional[str]]] = {
    "ram_plus": (["--method", "ram_plus"], "ramplus_tl"),
    "ram": (["--method", "ram"], "ram"),
    "ties": (["--method", "ties", "--density", "0.5", "--lambda", "1"], "ties"),
    "dare_ties": (["--method", "dare_ties", "--drop-rate", "0.5"], None),
    "task_arithmetic": (["--method", "task_arithmetic", "--lambda", "1"], "task_arithmetic"),
}
MERGEKIT_METHODS = ("ram", "ramplus_tl", "ties", "task_arithmetic")
# correctness pairs: (label, our extra args, mergekit method); both float32 compute and output
CHECKS = (
    ("ram_plus_tensor_vs_ramplus_tl",
     ["--method", "ram_plus", "--rho-scope", "tensor", "--alpha", "0.2", "--out-dtype", "float32"],
     "ramplus_tl"),
    ("ram_vs_ram", ["--method", "ram", "--out-dtype", "float32"], "ram"),
)


STARTUP_REPEAT = 3


@dataclass
class Row:
    """One benchmark line: a measured command, or a pending/skipped one."""

    name: str
    group: str  # floor | ours | mergekit | check
    method: str
    status: str = "pending"
    wall_s: Optional[float] = None
    peak_vmrss_mb: Optional[float] = None
    peak_rssanon_mb: Optional[float] = None
    out_gb: Optional[float] = None
    argv: list[str] = field(default_factory=list)
    log: Optional[str] = None
    note: str = ""


def dir_size_gb(path: str) -> float:
    """Total size of files under path, in GB."""
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total / 1e9


def ours_cli_ready(timeout: float = 120) -> tuple[bool, str]:
    """True when `python -m merging --help` works and lists analyze and merge."""
    try:
        p = subprocess.run([sys.executable, "-m", "merging", "--help"], cwd=REPO, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "`python -m merging --help` timed out"
    text = p.stdout + p.stderr
    if p.returncode != 0:
        return False, "CLI not ready: " + (text.strip().splitlines() or [""])[-1][:90]
    if "analyze" not in text or "merge" not in text:
        return False, "CLI has no analyze/merge subcommands yet"
    return True, ""


class Runner:
    """Holds paths and options; measures rows one by one."""

    def __init__(self, args: argparse.Namespace) -> None:
        """Set up data, output and log folders for one shape."""
        self.args = args
        self.data = os.path.abspath(args.data or os.path.join(BENCH, "data", args.shape))
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self.work = os.path.join(BENCH, "runs", f"{args.shape}-{stamp}")
        os.makedirs(self.work, exist_ok=True)
        self.inputs = [os.path.join(self.data, "base")] + [os.path.join(self.data, a) for a in AGENTS]
        self.rows: list[Row] = []
        self.checks: list[dict[str, Any]] = []

    def measure(self, row: Row, argv: list[str], out_dir: Optional[str] = None, keep: bool = False,
                cache: str = "analysis-cache", env_extra: Optional[dict[str, str]] = None) -> Row:
        """Run argv, fill row, delete out_dir afterwards (unless keep)."""
        row.argv, row.log = argv, os.path.join(self.work, row.name.replace(" ", "_").replace("/", "-") + ".log")
        print(f"[{time.strftime('%H:%M:%S')}] {row.name}: {' '.join(argv)}", flush=True)
        # an analysis cache per run (`analyze` is measured cold) or per row (cold merges)
        env = dict(os.environ, PYTHONPATH=REPO, RAM_STUDIO_CACHE=os.path.join(self.work, cache), **(env_extra or {}))
        m = run_measured(argv, log_path=row.log, env=env, cwd=REPO, timeout=self.args.timeout)
        row.wall_s, row.peak_vmrss_mb, row.peak_rssanon_mb = m.wall_s, m.peak_vmrss_mb, m.peak_rssanon_mb
        row.status = "ok" if m.rc == 0 else f"rc={m.rc}"
        if out_dir and os.path.isdir(out_dir):
            row.out_gb = dir_size_gb(out_dir)
            if not keep and not self.args.keep_outputs:
                shutil.rmtree(out_dir, ignore_errors=True)
        print(f"    -> {row.status} {row.wall_s:.1f} s, VmRSS {row.peak_vmrss_mb:.0f} MB, "
              f"RssAnon {row.peak_rssanon_mb:.0f} MB", flush=True)
        self.rows.append(row)
        return row

    def ensure_data(self) -> bool:
        """Generate the input set if missing; True when this run generated it."""
        if all(os.path.exists(os.path.join(p, "config.json")) for p in self.inputs):
            return False
        argv = [sys.executable, "-m", "tests.benchmarks.make_checkpoints", "--shape", self.args.shape,
                "--out", self.data, "--seed", str(self.args.seed)]
        if self.args.device == "cuda":
            argv += ["--device", "cuda"]  # the hash generator (the 7B default) runs on the GPU
        self.measure(Row("generate", "setup", "-"), argv)
        return True

    def floor(self, repeat: int = 1) -> None:
        """Measure F (repeat times; the table uses the fastest, the least disturbed by other load)."""
        for i in range(repeat):
            name = "floor F" if repeat == 1 else f"floor F #{i + 1}"
            self.measure(Row(name, "floor", "floor"), [sys.executable, "-m", "tests.benchmarks.floor", *self.inputs])

    def ours(self, analyze: bool, methods: list[str]) -> None:
        """Measure `merging analyze` and `merging merge` per method, or mark them pending."""
        if not analyze and not methods:
            return
        ready, why = (False, "--skip-ours") if self.args.skip_ours else ours_cli_ready()
        cli = [sys.executable, "-m", "merging"]
        if not ready:
            if analyze:
                self.rows.append(Row("ours analyze", "ours", "analyze", note=why))
            for m in methods:
                self.rows.append(Row(f"ours {m}", "ours", m, note=why))
            return
        dev = ["--device", self.args.device]
        if analyze:
            self.measure(Row("ours analyze", "ours", "analyze"), cli + ["analyze", *self.inputs, *dev])
        for m in methods:
            out = os.path.join(self.work, f"out-ours-{m}")
            self.measure(Row(f"ours {m}", "ours", m), cli + ["merge", *self.inputs, *OUR_METHODS[m][0], *dev,
                                                             "--out", out], out, cache=f"cache-{m}")
        if analyze and "ram_plus" in methods:
            out = os.path.join(self.work, "out-ours-ram_plus-cached")
            self.measure(Row("ours ram_plus (analysis cached)", "ours", "ram_plus"),
                         cli + ["merge", *self.inputs, *OUR_METHODS["ram_plus"][0], *dev, "--out", out], out)

    def startup(self) -> None:
        """When our CLI reads its first tensor byte, next to `import torch` alone (best of a few runs)."""
        torch_s, first_s = [], []
        for _ in range(STARTUP_REPEAT):
            m = run_measured([sys.executable, "-c", "import torch"], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
            torch_s.append(m.wall_s)
            log = os.path.join(self.work, "startup.log")
            env = dict(os.environ, PYTHONPATH=REPO, RAM_STUDIO_TRACE_START="1",
                       RAM_STUDIO_CACHE=os.path.join(self.work, f"cache-startup-{len(first_s)}"))
            run_measured([sys.executable, "-m", "merging", "analyze", *self.inputs, "--quiet"], log_path=log,
                         env=env, cwd=REPO, timeout=20)
            with open(log) as f:
                hits = [float(w) for line in f if "first tensor byte" in line
                        for w in line.split() if w.replace(".", "", 1).isdigit()]
            first_s.append(hits[0] if hits else float("nan"))
        self.rows.append(Row("import torch (alone)", "startup", "startup", "ok", min(torch_s)))
        self.rows.append(Row("ours: first tensor byte read", "startup", "startup", "ok", min(first_s),
                             note=f"{min(first_s) - min(torch_s):+.2f} s vs import torch"))

    def mergekit(self, methods: list[str], float32: bool = False, keep: bool = False) -> dict[str, str]:
        """Measure mergekit-yaml per method (with --cuda on a GPU run); returns method -> output dir."""
        cuda = ("--cuda",) if self.args.device == "cuda" else ()
        return self._mergekit(methods, float32, keep, cuda)

    def _mergekit(self, methods: list[str], float32: bool, keep: bool, extra: tuple[str, ...]) -> dict[str, str]:
        """Measure mergekit-yaml per method; returns method -> output dir (kept only if keep)."""
        outs = {}
        for m in methods:
            tag = f"{m}-f32" if float32 else m
            cfg = write_config(os.path.join(self.work, f"mergekit-{tag}.yaml"),
                               mergekit_config(self.data, m, float32=float32))
            out = os.path.join(self.work, f"out-mergekit-{tag}")
            argv = mergekit_command(cfg, out, shard_size=self.args.mergekit_shard_size, extra=extra)
            self.measure(Row(f"mergekit {tag}", "check" if float32 else "mergekit", m), argv, out, keep)
            outs[m] = out
        return outs

    def correctness(self) -> None:
        """Ours vs mergekit in float32 for ram / ram_plus(tensor-local); streamed per-tensor diff."""
        ready, why = (False, "--skip-ours") if self.args.skip_ours else ours_cli_ready()
        for label, our_args, mk_method in CHECKS:
            if not ready:
                self.checks.append({"check": label, "status": "pending", "note": why})
                continue
            ours_out = os.path.join(self.work, f"out-check-ours-{label}")
            row = self.measure(Row(f"check ours {label}", "check", mk_method),
                               [sys.executable, "-m", "merging", "merge", *self.inputs, *our_args, "--out", ours_out],
                               ours_out, keep=True)
            mk_out = self.mergekit([mk_method], float32=True, keep=True)[mk_method]
            if row.status == "ok" and self.rows[-1].status == "ok":
                res = compare_dirs(ours_out, mk_out)
                with open(os.path.join(self.work, f"check-{label}.json"), "w") as f:
                    json.dump(res, f, indent=2)
                summary = {k: v for k, v in res.items() if k != "per_tensor"}
                self.checks.append({"check": label, "status": "ok", **summary})
            else:
                self.checks.append({"check": label, "status": "failed"})
            if not self.args.keep_outputs:
                shutil.rmtree(ours_out, ignore_errors=True)
                shutil.rmtree(mk_out, ignore_errors=True)


def ratio(a: Optional[float], b: Optional[float]) -> str:
    """a / b formatted, or '-'."""
    return f"{a / b:.2f}" if a is not None and b else "-"


def load_baseline(path: str) -> list[Row]:
    """Floor and mergekit rows of an earlier results JSON (to get ratios in split runs)."""
    with open(path) as f:
        doc = json.load(f)
    return [Row(**{**x, "name": x["name"] + " (baseline)"}) for x in doc["rows"]
            if x["group"] in ("floor", "mergekit") and x["status"] == "ok"]


def print_table(rows: list[Row], baseline: Optional[list[Row]] = None) -> None:
    """Print times with ratios to F and to mergekit's time for the same method."""
    ref = rows + (baseline or [])
    floors = [r.wall_s for r in rows if r.group == "floor" and r.status == "ok"] or \
        [r.wall_s for r in ref if r.group == "floor" and r.status == "ok"]
    floor = min(floors) if floors else None
    mk = {r.method: r.wall_s for r in ref if r.group == "mergekit" and r.status == "ok"}
    our_to_mk = {m: v[1] for m, v in OUR_METHODS.items()}
    print(f"\n{'command':36} {'status':8} {'wall s':>8} {'xF':>6} {'xMK':>6} {'VmRSS MB':>9} {'Anon MB':>8} "
          f"{'out GB':>7}")
    for r in rows:
        mk_t = mk.get(our_to_mk.get(r.method,
                                    "")) if r.group == "ours" else mk.get(r.method) if r.group == "mergekit" else None
        wall = f"{r.wall_s:.1f}" if r.wall_s is not None else "-"
        rss = f"{r.peak_vmrss_mb:.0f}" if r.peak_vmrss_mb is not None else "-"
        anon = f"{r.peak_rssanon_mb:.0f}" if r.peak_rssanon_mb is not None else "-"
        out = f"{r.out_gb:.2f}" if r.out_gb is not None else "-"
        print(f"{r.name:36} {r.status:8} {wall:>8} {ratio(r.wall_s, floor):>6} {ratio(r.wall_s, mk_t):>6} "
              f"{rss:>9} {anon:>8} {out:>7}  {r.note}")


def device_name(device: str) -> str:
    """The device our commands run on, in words (the GPU's name on a CUDA run)."""
    import torch

    if device in ("cuda", "auto") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (CUDA), {os.cpu_count()} CPUs"
    return f"CPU only, {os.cpu_count()} CPUs"


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"],
                    help="our --device (and mergekit --cuda when cuda); F is always the CPU read floor")
    ap.add_argument("--data", help="input set folder (default .bench/data/SHAPE)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="comma list of methods (ours and/or mergekit names, 'floor', 'startup', "
                                   "'analyze', 'check')")
    ap.add_argument("--skip-mergekit", action="store_true")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--keep-data", action="store_true", help="keep inputs this run generated")
    ap.add_argument("--keep-outputs", action="store_true", help="keep merge output folders")
    ap.add_argument("--mergekit-shard-size", default=None, help="mergekit --out-shard-size (default: its 5B)")
    ap.add_argument("--timeout", type=float, default=None, help="per-command timeout in seconds")
    ap.add_argument("--results", help="results JSON path (default under .bench/results)")
    ap.add_argument("--baseline", help="earlier results JSON whose floor/mergekit rows give the ratios")
    ap.add_argument("--floor-repeat", type=int, default=1, help="measure F this many times, use the fastest")
    ap.add_argument("--table", help="only print the table of an existing results JSON")
    return ap.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> None:
    """Run the selected benchmarks, print the table, write the JSON results."""
    args = parse_args(argv)
    if args.table:
        with open(args.table) as f:
            rows = [Row(**x) for x in json.load(f)["rows"]]
        print_table(rows, load_baseline(args.baseline) if args.baseline else None)
        return
    only = set(args.only.split(",")) if args.only else None

    def want(m: str) -> bool:
        return only is None or m in only

    if not os.path.exists(os.path.join(MERGEKIT_VENV, "bin", "mergekit-yaml")) and not args.skip_mergekit:
        sys.exit("mergekit venv missing: run tests/benchmarks/setup_mergekit.sh (or pass --skip-mergekit)")
    r = Runner(args)
    load_before = os.getloadavg()
    print(f"device: {device_name(args.device)}; load average {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f} on {os.cpu_count()} CPUs", flush=True)
    generated = r.ensure_data()
    try:
        if want("floor"):
            r.floor(args.floor_repeat)
        if want("startup"):
            r.startup()
        r.ours(want("analyze"), [m for m in OUR_METHODS if want(m)])
        if not args.skip_mergekit:
            r.mergekit([m for m in MERGEKIT_METHODS if want(m)])
            if not args.skip_check and want("check"):
                r.correctness()
    finally:
        print_table(r.rows, load_baseline(args.baseline) if args.baseline else None)
        for c in r.checks:
            print("check:", json.dumps(c))
        os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
        path = args.results or os.path.join(BENCH, "results", os.path.basename(r.work) + ".json")
        with open(path, "w") as f:
            json.dump({"shape": args.shape, "data": r.data, "host_cpus": os.cpu_count(),
                       "device": device_name(args.device),
                       "load_before": load_before, "load_after": os.getloadavg(),
                       "note": "shared machine; timings noisy; page cache warm unless stated",
                       "rows": [vars(x) for x in r.rows], "checks": r.checks}, f, indent=2)
        print(f"results: {path}")
        if generated and not args.keep_data:
            shutil.rmtree(r.data, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The app's long jobs against the CLI, side by side in one run.

    python -m tests.benchmarks.app_vs_cli [--set .bench/data/qwen2.5-0.5b] [--runs 2]
        [--jobs merge,analyze,evaluate,fig3] [--out tests/benchmarks/results-app-vs-cli-DATE.json]

Each job runs three ways, interleaved run by run:
- `cli`: the ram-studio command in a fresh process (wall time of the process);
- `plain`: the app's job code (the `app.jobs` manager's worker thread; the analysis as `app.state` runs it)
  in a plain Python process;
- `app`: the same inside a real `streamlit run` server (tests/benchmarks/app_job_page.py), started by
  a headless chromium session, with a fragment polling the job every 0.5 s as the Merge page does.
`job_s` is the job's own time (submit → finished; for the CLI the process's wall time, start-up
included); CPU seconds are the process's (the server's, over the job). The merge runs ram_plus on `--set`
with the analysis cached (as in the app, where the Models page analysed first) and, for the CLI, also
cold (counting pass included); outputs are hashed and must be identical. Evaluation and Fig. 3 run on the
bundled demo (they need its tokenizer and tasks); Fig. 3 has no CLI counterpart doing the same work.
Timings on the shared 2-core machine are noisy: the load average is recorded with every run.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.browser.chromium import CHROMIUM

ROOT = Path(__file__).resolve().parents[2]
PAGE = Path(__file__).with_name("app_job_page.py")
DEMO = ROOT / "assets" / "demo" / "models"


def load() -> float:
    return round(os.getloadavg()[0], 2)


def digest(folder: Path) -> str:
    """sha256 over the merged weights (every .safetensors file, by name)."""
    h = hashlib.sha256()
    for f in sorted(folder.glob("*.safetensors")):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            while block := fh.read(1 << 24):
                h.update(block)
    return h.hexdigest()


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(cmd: list[str], env: dict) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    la, t = load(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return {"job_s": round(wall, 2),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
            "load": la, "stdout_tail": proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []}


# ---------------------------------------------------------------- the app's job code, in a plain process

def page_functions(rel: str) -> dict:
    """The top-level imports and functions of a page script (the evaluation's and the Fig. 3 job's worker
    bodies live in app/views/), without running its page code."""
    import ast

    tree = ast.parse((ROOT / rel).read_text())
    keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef))]
    ns: dict = {"__name__": f"bench_{Path(rel).stem}"}
    exec(compile(ast.Module(keep, []), str(ROOT / rel), "exec"), ns)  # noqa: S102 - our own source
    return ns


def plain_job(cfg: dict) -> dict:
    """Run one job the way the app does, outside Streamlit (called in a fresh process)."""
    from analysis.ladder import DEFAULT_LADDER
    from app import jobs

    mgr = jobs.JobManager()
    t0 = time.time()
    kind = cfg["kind"]
    if kind == "analyze":
        from analysis.stats import analyze

        analyze(cfg["base"], list(cfg["agents"]), ladder=DEFAULT_LADDER, progress=lambda p: None, use_cache=False)
        return {"job_s": time.time() - t0}
    if kind == "merge":
        from analysis.agreement import merge_statistics
        from analysis.stats import cached_result
        from merging.recipe import MergeSpec

        spec = MergeSpec(cfg["base"], list(cfg["agents"]), cfg["method"], {}, cfg["out"])
        counts, overlap = merge_statistics(cached_result(spec.base, spec.agents), spec.method, spec.params)
        ns = page_functions("app/views/merge.py")
        job = mgr.submit("merge", "plain", "bench", lambda j: ns["run_merge"](spec, j, overwrite=True, counts=counts,
                                                                              overlap=overlap, provenance=None),
                         merges=True, out=Path(spec.out), request=spec)
    else:
        ns = page_functions("app/views/merge.py" if kind == "evaluate" else "app/views/dilution.py")
        if kind == "evaluate":
            folder = Path(cfg["folder"])
            job = mgr.submit("eval", "plain", "bench", lambda j: ns["run_demo_eval"](folder, j), exclusive=False)
        else:
            from app.state import Selection

            sel = Selection(cfg["base"], tuple(cfg["agents"]), "custom")
            job = mgr.submit("fig3", "plain", "fig3", lambda j: ns["run_fig3"](sel, j), merges=True)
    while job.running:  # the page's poll: read the progress twice a second
        _ = job.fraction, job.detail
        time.sleep(0.5)
    if job.status != "done":
        raise SystemExit(f"{kind} {job.status}: {job.error}")
    return {"job_s": job.elapsed, "engine_s": getattr(getattr(job, "result", None), "seconds", None)}


def run_plain(cfg: dict, env: dict) -> dict:
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    la = load()
    proc = subprocess.run([sys.executable, "-m", "tests.benchmarks.app_vs_cli", "--plain-job", json.dumps(cfg)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"plain {cfg['kind']} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**{k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()},
            "cpu_s": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 2), "load": la}


# ---------------------------------------------------------------- the app's job code, in a Streamlit server

_BROWSER: list = []  # (playwright, browser): one per benchmark process, shared by the servers


def browser():
    if not _BROWSER:
        from playwright.sync_api import sync_playwright

        pw = sync_playwright().start()
        _BROWSER.extend([pw, pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])])
    return _BROWSER[1]


def close_browser() -> None:
    if _BROWSER:
        _BROWSER[1].close()
        _BROWSER[0].stop()
        _BROWSER.clear()


class AppServer:
    """`streamlit run app_job_page.py` for one job kind; each `run()` opens a new browser session."""

    def __init__(self, cfg: dict, env: dict, scratch: Path, extra: tuple[str, ...] = (), name: str = "app") -> None:
        self.cfg = {**cfg, "result": str(scratch / f"{name}-{cfg['kind']}")}
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.log = open(scratch / f"streamlit-{name}-{cfg['kind']}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(PAGE), "--server.port", str(port),
                                      "--server.headless", "true", "--server.address", "127.0.0.1",
                                      "--browser.gatherUsageStats", "false", *extra],
                                     cwd=ROOT, env={**env, "RAM_BENCH_JOB": json.dumps(self.cfg)},
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        import urllib.request

        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.3)
        else:
            raise SystemExit("streamlit did not start")
        self.browser = browser()
        self.runs = 0

    def run(self, timeout: float = 1800) -> dict:
        self.runs += 1
        path = Path(f"{self.cfg['result']}.{self.runs}.json")
        la, cpu0 = load(), proc_cpu(self.proc.pid)
        page = self.browser.new_page()
        page.goto(self.url)
        deadline = time.time() + timeout
        while not path.exists():
            if time.time() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"app {self.cfg['kind']} run {self.runs} did not finish; see the streamlit log")
            page.wait_for_timeout(250)
        cpu = proc_cpu(self.proc.pid) - cpu0
        page.close()
        out = json.loads(path.read_text())
        if out.get("status") != "done":
            raise SystemExit(f"app {self.cfg['kind']}: {out}")
        return {"job_s": round(out["job_s"], 2), "engine_s": out.get("engine_s") and round(out["engine_s"], 2),
                "cpu_s": round(cpu, 2), "load": la, "server_pid": out["pid"]}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


# ---------------------------------------------------------------- the comparison

def models(folder: Path, names: list[str]) -> tuple[str, list[str]]:
    return str(folder / names[0]), [str(folder / n) for n in names[1:]]


def compare(kind: str, cfg: dict, cli: dict[str, tuple[list[str], dict]], env: dict, scratch: Path, runs: int,
            outputs: dict[str, Path] | None = None, gc_on: bool = False) -> dict:
    """Interleave the CLI variants, the plain process and the app server `runs` times (with `gc_on`, also
    a server with Streamlit's default `runner.postScriptGC = true`, as the app once ran)."""
    rows: dict[str, list[dict]] = {name: [] for name in [*cli, "plain", "app", *(["app_gc_on"] if gc_on else [])]}
    hashes: dict[str, str] = {}
    servers = {"app": AppServer(cfg, env, scratch)}
    try:
        if gc_on:
            servers["app_gc_on"] = AppServer(cfg, env, scratch, ("--runner.postScriptGC", "true"), "app_gc_on")
        for r in range(runs):
            for name, (cmd, cmd_env) in cli.items():
                rows[name].append(timed(cmd, cmd_env))
                if outputs and name in outputs:
                    hashes[name] = digest(outputs[name])
            rows["plain"].append(run_plain(cfg, env))
            if outputs:
                hashes["plain"] = digest(Path(cfg["out"]))
            for name, server in servers.items():
                rows[name].append(server.run())
                if outputs:
                    folder = Path(f"{server.cfg['result']}-out.{server.runs}")
                    hashes[name] = digest(folder)
                    shutil.rmtree(folder)
            print(f"[{kind}] run {r + 1}: " + "  ".join(f"{k} {v[-1]['job_s']:.1f} s" for k, v in rows.items()),
                  flush=True)
    finally:
        for server in servers.values():
            server.close()
    med = {k: round(statistics.median(x["job_s"] for x in v), 2) for k, v in rows.items()}
    first_cli = next(iter(cli)) if cli else "plain"
    summary = {"runs": rows, "median_job_s": med,
               "app_over_plain": round(med["app"] / med["plain"], 2),
               "app_gc_on_over_plain": round(med["app_gc_on"] / med["plain"], 2) if gc_on else None,
               "app_over_cli": round(med["app"] / med[first_cli], 2) if cli else None,
               "cli_reference": first_cli if cli else None}
    if outputs:
        summary["output_sha256"] = hashes
        summary["identical_outputs"] = len(set(hashes.values())) == 1
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.benchmarks.app_vs_cli", description=__doc__.splitlines()[0])
    ap.add_argument("--set", type=Path, default=ROOT / ".bench" / "data" / "qwen2.5-0.5b",
                    help="base + agents folder (base, agent_code, agent_tool, agent_memory), read only")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--jobs", default="merge,analyze,evaluate,fig3")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--gc-on-jobs", default="merge,evaluate,fig3",
                    help="jobs also run in a server with Streamlit's default post-script GC (as the app ran before it "
                         "turned that GC off)")
    ap.add_argument("--plain-job", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.plain_job:
        print(json.dumps(plain_job(json.loads(args.plain_job))))
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="ram-app-vs-cli-"))
    env = {**os.environ, "RAM_STUDIO_CACHE": str(scratch / "cache"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    cold_env = {**env, "RAM_STUDIO_CACHE": str(scratch / "cache-empty")}
    cli = [sys.executable, "-m", "ram_studio"]
    from merging.kernels import cached_marker_exists

    report: dict = {"machine": f"{os.cpu_count()} cores, shared with other sessions", "load_start": load(),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "kernels_cached": {d: cached_marker_exists(d, ("ram", "count_and_peak")) for d in ("bf16", "f32")},
                    "set": str(args.set), "jobs": {}}
    jobs, gc_jobs = args.jobs.split(","), args.gc_on_jobs.split(",")
    try:
        base, agents = models(args.set, ["base", "agent_code", "agent_tool", "agent_memory"])
        if "merge" in jobs:
            timed(cli + ["analyze", base, *agents, "--quiet"], env)  # the app merges with the analysis cached
            out = scratch / "merged"
            cfg = {"kind": "merge", "base": base, "agents": agents, "method": "ram_plus", "out": str(out)}
            cmd = cli + ["merge", base, *agents, "--method", "ram_plus", "--overwrite", "--quiet", "--out"]
            report["jobs"]["merge"] = compare(
                "merge", cfg, {"cli_cached": (cmd + [str(scratch / "cli-cached")], env),  # after `analyze`
                               "cli_cold": (cmd + [str(scratch / "cli-cold")], cold_env)},  # counting pass included
                env, scratch, args.runs, {"cli_cached": scratch / "cli-cached", "cli_cold": scratch / "cli-cold"},
                gc_on="merge" in gc_jobs)
        if "analyze" in jobs:
            cfg = {"kind": "analyze", "base": base, "agents": agents}
            report["jobs"]["analyze"] = compare("analyze", cfg, {"cli": (cli + ["analyze", base, *agents, "--quiet",
                                                                               "--no-cache"], env)}, env, scratch,
                                                                               args.runs)
        dbase, dagents = models(DEMO, ["base", "code", "tool", "memory"])
        if "evaluate" in jobs:
            folder = scratch / "demo-merged"
            timed(cli + ["merge", dbase, *dagents, "--method", "ram_plus", "--quiet", "--out", str(folder)], env)
            cfg = {"kind": "evaluate", "folder": str(folder), "base": dbase, "agents": dagents}
            report["jobs"]["evaluate"] = compare("evaluate", cfg, {"cli": (cli + ["evaluate", str(folder), "--quiet",
                                                                                 "--split", "test"], env)},
                                                 env, scratch, args.runs, gc_on="evaluate" in gc_jobs)
        if "fig3" in jobs:
            # The demo selected as the app selects it (its measured base and agent rows are then reused).
            cfg = {"kind": "fig3", "base": "demo:base", "agents": ["demo:code", "demo:tool", "demo:memory"]}
            report["jobs"]["fig3"] = compare("fig3", cfg, {}, env, scratch, args.runs, gc_on="fig3" in gc_jobs)
    finally:
        close_browser()
        shutil.rmtree(scratch, ignore_errors=True)
    report["load_end"] = load()
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The app as a user sees it against the CLI, side by side in one run: a real browser clicks, a clock waits for
the result.

    python -m tests.benchmarks.app_click [--set .bench/data/qwen2.5-0.5b] [--runs 5] [--jobs analyze,merge]
        [--out FILE]

- merge: in a `streamlit run` server whose disk cache holds the analysis of the set (as after any earlier look
  at the models), chromium picks the models on the Models page, opens Merge & export, types an output folder
  and clicks "Start merge"; timed from the click until the merge's `ram_recipe.json` exists (and, apart, until
  the page shows "Merged into"). Against `ram-studio merge --method ram_plus` in a fresh process with the same
  cache (wall time of the process, start-up included). Outputs are hashed and must be identical.
- analyze: a fresh server (its start-up not timed) with an empty cache; chromium picks the models and opens
  Heterogeneity; timed from the click on the page's link until its charts are drawn. Against a cold
  `ram-studio analyze` in a fresh process with an empty cache.

Runs are interleaved (app, CLI, app, CLI, …); medians and app / CLI ratios are printed with the load average
of every run. On a shared machine the numbers are noisy: rerun on a quiet one.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.benchmarks.app_vs_cli import digest, load, proc_cpu, timed
from tests.browser.chromium import ARGS, CHROMIUM

ROOT = Path(__file__).resolve().parents[2]
APP_MAIN = ROOT / "app" / "main.py"
MODELS = ("base", "agent_code", "agent_tool", "agent_memory")
CHART = '[class*="st-key-chart_"] [data-testid="stPlotlyChart"]'  # a page's chart (not the hidden library loader)


class Server:
    """A `streamlit run app/main.py` on a free port with the given analysis cache."""

    def __init__(self, cache: Path, log: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "RAM_STUDIO_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(APP_MAIN), "--server.port",
                                      str(self.port), "--server.headless", "true", "--server.address", "127.0.0.1"],
                                     cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 120
        while time.time() < deadline and self.proc.poll() is None:
            try:
                if urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2).status == 200:
                    return
            except OSError:
                time.sleep(0.3)
        raise SystemExit(f"streamlit did not start: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def settle(pg, timeout: float = 600) -> None:
    """Until the script run finished (no 'Running…' status widget)."""
    deadline = time.time() + timeout
    pg.wait_for_timeout(200)
    while time.time() < deadline and pg.locator('[data-testid="stStatusWidget"]').count():
        pg.wait_for_timeout(50)


def nav(pg, title: str) -> None:
    pg.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first.click()


def select(pg, server: Server, folders: list[Path]) -> None:
    """The Models page: custom local folders, "Use these models"."""
    pg.goto(f"{server.url}/models")  # by its address: a click while the root still forwards could be overtaken
    pg.get_by_role("heading", name="Models", level=1).wait_for()
    settle(pg)
    pg.get_by_text("Custom: local folders or Hub ids").click()
    pg.get_by_role("textbox", name="Base model").fill(str(folders[0]))
    pg.get_by_role("textbox", name="Agents (one per line)").fill("\n".join(map(str, folders[1:])))
    pg.keyboard.press("Control+Enter")
    settle(pg)
    pg.get_by_role("button", name="Use these models").click()
    pg.get_by_text("Selected.").wait_for(timeout=600_000)
    settle(pg)


def app_analysis(browser, folders: list[Path], tmp: Path) -> dict:
    """A fresh server and an empty cache: click Heterogeneity, wait for its charts."""
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=tmp))
    server = Server(cache, tmp / "analysis-server.log")
    try:
        pg = browser.new_page(viewport={"width": 1280, "height": 800})
        pg.set_default_timeout(600_000)
        select(pg, server, folders)
        la, cpu0, t = load(), proc_cpu(server.proc.pid), time.perf_counter()
        nav(pg, "Heterogeneity")
        pg.locator(CHART).first.wait_for(timeout=600_000)
        settle(pg)
        wall = time.perf_counter() - t
        cpu = proc_cpu(server.proc.pid) - cpu0
        pg.close()
        return {"job_s": round(wall, 2), "cpu_s": round(cpu, 2), "load": la}
    finally:
        server.stop()
        shutil.rmtree(cache, ignore_errors=True)


def app_merge(pg, out: Path, cpu_of) -> dict:
    """Merge & export: type the output folder, click Start merge; until the recipe is on disk, and until the page
    says so."""
    nav(pg, "Merge & export")
    box = pg.get_by_role("textbox", name="Output folder")
    box.wait_for()
    box.fill(str(out))
    box.press("Enter")
    settle(pg)
    la, cpu0 = load(), cpu_of()
    button = pg.get_by_role("button", name="Start merge")
    t = time.perf_counter()
    button.click()
    recipe = out / "ram_recipe.json"
    while not recipe.exists():
        time.sleep(0.02)
    written = time.perf_counter() - t
    pg.get_by_text("Merged into").wait_for(timeout=600_000)
    shown = time.perf_counter() - t
    return {"job_s": round(written, 2), "shown_s": round(shown, 2), "cpu_s": round(cpu_of() - cpu0, 2), "load": la,
            "sha256": digest(out)}


def cli(args: list[str], cache: Path) -> dict:
    env = {**os.environ, "RAM_STUDIO_CACHE": str(cache)}
    return timed([sys.executable, "-m", "ram_studio", *args, "--quiet"], env)


def summary(rows: dict[str, list[dict]]) -> dict:
    med = {k: statistics.median(r["job_s"] for r in v) for k, v in rows.items() if v}
    return {"median_s": med, "app_over_cli": round(med["app"] / med["cli"], 2) if "app" in med and "cli" in med
            else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default=".bench/data/qwen2.5-0.5b")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--jobs", default="analyze,merge")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    folders = [Path(args.set).resolve() / m for m in MODELS]
    tmp = Path(tempfile.mkdtemp(prefix="app-click-"))
    results: dict = {"set": str(args.set), "runs": args.runs, "cores": os.cpu_count(), "started": time.ctime()}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            if "analyze" in args.jobs:
                rows: dict[str, list[dict]] = {"app": [], "cli": []}
                for i in range(args.runs):
                    rows["app"].append(app_analysis(browser, folders, tmp))
                    empty = Path(tempfile.mkdtemp(prefix="cli-cache-", dir=tmp))
                    rows["cli"].append(cli(["analyze", *map(str, folders)], empty))
                    shutil.rmtree(empty, ignore_errors=True)
                    print(f"analyze run {i + 1}: app {rows['app'][-1]}  cli {rows['cli'][-1]}", flush=True)
                results["analyze"] = {"rows": rows, **summary(rows)}
            if "merge" in args.jobs:
                results["merge"] = merge_runs(browser, folders, tmp, args.runs)
        finally:
            browser.close()
    for job in ("analyze", "merge"):
        if job in results:
            print(f"{job}: medians {results[job]['median_s']}, app / CLI = {results[job]['app_over_cli']}")
    print(f"load average now {load()} on {os.cpu_count()} cores")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def merge_runs(browser, folders: list[Path], tmp: Path, runs: int) -> dict:
    """One server, its disk cache filled by an analysis first; interleaved app and CLI merges."""
    cache = tmp / "merge-cache"
    cli(["analyze", *map(str, folders)], cache)
    server = Server(cache, tmp / "merge-server.log")
    rows: dict[str, list[dict]] = {"app": [], "cli": []}
    try:
        pg = browser.new_page(viewport={"width": 1280, "height": 800})
        pg.set_default_timeout(600_000)
        select(pg, server, folders)
        for i in range(runs):
            out = tmp / f"app-{i}"
            rows["app"].append(app_merge(pg, out, lambda: proc_cpu(server.proc.pid)))
            shutil.rmtree(out, ignore_errors=True)
            out = tmp / f"cli-{i}"
            rows["cli"].append({**cli(["merge", *map(str, folders), "--method", "ram_plus", "--out", str(out)], cache),
                                "sha256": digest(out)})
            shutil.rmtree(out, ignore_errors=True)
            print(f"merge run {i + 1}: app {rows['app'][-1]}  cli {rows['cli'][-1]}", flush=True)
    finally:
        server.stop()
    hashes = {r["sha256"] for v in rows.values() for r in v}
    return {"rows": rows, **summary(rows), "identical_outputs": len(hashes) == 1}


if __name__ == "__main__":
    raise SystemExit(main())

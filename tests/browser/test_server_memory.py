"""Soak test of a long-running server's memory: one real `streamlit run app/main.py`, driven by headless chromium
through many distinct model sets (each analysed on the Heterogeneity page) and many merges (each a job on the
Merge page), with small limits on what the server keeps (RAM_STUDIO_APP_ANALYSIS_MEMORY, RAM_STUDIO_APP_JOB_MEMORY).
Its resident memory, sampled from /proc after every set, must stay bounded by those limits: after a warm-up
it grows by no more than the limits plus a fixed allowance for Streamlit's own per-session state, while the
analyses alone would add about 5 MB each without them (tests/benchmarks/server_memory.py runs both side by side).

The models are tiny real Qwen2 checkpoints built here: one base and 18 sparse agents; each set is the base and
16 of them (a set's statistics grow with the number of agent pairs, so each analysis is large for its cost)."""
from __future__ import annotations

import itertools
import os
import re
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.app_helpers import app_env, start_server, stop_server
from tests.browser.chromium import ARGS, CHROMIUM, needs_chromium

MB = 1_000_000
ANALYSIS_LIMIT, JOB_LIMIT = 8 * MB, 50_000
SETS, MERGES, WARM_UP, PER_SET = 14, 4, 4, 16
ALLOWANCE = 40 * MB  # what the server grows by anyway over 10 sets (Streamlit's sessions and buffers): measured
# 35 MB at the peak and 16 MB at the end with the limits in place, where the analyses alone add 6.5 MB a set
SESSION_TTL = 10  # seconds Streamlit keeps a closed tab's session (server.disconnectedSessionTTL; 120 by default)
# so that the tab can reconnect. The soak opens a new session every ~10 s: with the default it measured how many
# recently closed tabs the server remembers (their page elements, 60-80 MB here), not what the limits keep.

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [needs_chromium, pytest.mark.timeout(900)]


def build_models(root: Path, agents: int = 18) -> tuple[Path, list[Path]]:
    from tests.factory import make_agent, make_base

    base = make_base(root / "base", shard=None)
    return base, [make_agent(base, root / f"agent-{i:02d}", 0.3, seed=500 + i) for i in range(agents)]


def resident(pid: int) -> int:
    """A process's resident memory now (VmRSS, bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_set(pg, url: str, base: Path, agents: tuple[Path, ...], page: str = "") -> None:
    pg.goto(f"{url}/{page}?" + urlencode({"base": str(base), "agent": [str(a) for a in agents]}, doseq=True))
    pg.wait_for_selector('[data-testid="stAppViewContainer"]')


def settle(pg, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    pg.wait_for_timeout(300)
    while time.time() < deadline and pg.locator('[data-testid="stStatusWidget"]').count():
        pg.wait_for_timeout(200)


def analyse(pg, url: str, base: Path, agents: tuple[Path, ...]) -> None:
    """The Heterogeneity page on this set: the analysis runs, then its charts are drawn."""
    open_set(pg, url, base, agents)
    pg.locator('[data-testid="stPlotlyChart"]').nth(4).wait_for(timeout=300_000)
    settle(pg)
    assert pg.locator('[data-testid="stException"]').count() == 0


def merge(pg, url: str, base: Path, agents: tuple[Path, ...], out: Path) -> None:
    """A merge job from the Merge page on this set, into `out`."""
    open_set(pg, url, base, agents, "merge")
    box = pg.get_by_role("textbox", name="Output folder")
    box.fill(str(out))
    box.press("Enter")
    pg.get_by_text("Your folder.").wait_for()
    settle(pg)
    pg.get_by_role("button", name="Start merge").click()
    pg.get_by_text("Merged into").wait_for(timeout=180_000)
    assert (out / "ram_recipe.json").exists()


def soak(tmp: Path, analysis_limit: str, job_limit: str, sets: int = SETS, merges: int = MERGES,
         per_set: int = PER_SET) -> dict:
    """Run the soak in one server with these limits; the server's resident memory after each step and its log."""
    base, pool = build_models(tmp / "models", per_set + 2)  # C(per_set + 2, 2) distinct sets
    env = {**os.environ, **app_env(tmp), "RAM_STUDIO_APP_ANALYSIS_MEMORY": analysis_limit,
           "RAM_STUDIO_APP_JOB_MEMORY": job_limit, "STREAMLIT_SERVER_DISCONNECTED_SESSION_TTL": str(SESSION_TTL)}
    proc, url = start_server(tmp, env)
    samples: list[tuple[str, int]] = [("start", resident(proc.pid))]
    timing: list[tuple[float, float]] = []  # seconds: (analysis page, merge) per set
    combos = itertools.islice(itertools.combinations(pool, per_set), sets)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            pg = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            pg.set_default_timeout(120_000)
            for i, agents in enumerate(combos):
                t0 = time.time()
                analyse(pg, url, base, agents)
                t1 = time.time()
                if i < merges:
                    merge(pg, url, base, agents, tmp / "merged" / f"set-{i:02d}")
                samples.append((f"set {i + 1}", resident(proc.pid)))
                timing.append((round(t1 - t0, 1), round(time.time() - t1, 1)))
            browser.close()
    finally:
        stop_server(proc)
    return {"samples": samples, "timing": timing, "log": (tmp / "streamlit.log").read_text()}


def kept(log: str, what: str) -> list[tuple[int, float]]:
    """(count, MB) of what the server kept, from each 'dropped …' line of its log."""
    unit = {"B": 1e-6, "KB": 1e-3, "MB": 1.0, "GB": 1e3}
    found = re.findall(rf"(\d+) {what} kept, ([\d.]+) (B|KB|MB|GB) of", log)
    return [(int(n), float(v) * unit[u]) for n, v, u in found]


def test_a_long_running_servers_memory_stays_within_its_limits(tmp_path):
    run = soak(tmp_path, f"{ANALYSIS_LIMIT}", f"{JOB_LIMIT}")
    samples, log = run["samples"], run["log"]
    table = " · ".join(f"{name}: {rss / MB:.0f} MB" for name, rss in samples)
    print(f"server resident memory: {table}")
    analyses, records = kept(log, "(?:analysis|analyses)"), kept(log, "job records?")
    assert len(analyses) >= SETS // 2, log[-3000:]  # the analyses were dropped as new ones came…
    assert all(mb <= ANALYSIS_LIMIT / MB for _, mb in analyses)  # …the server never kept more than its limit
    # the newest job record stays even when it alone is larger than the limit (a page is still showing it); with
    # two or more kept, the limit holds
    assert records and all(mb <= JOB_LIMIT / MB or n == 1 for n, mb in records), records
    warm = dict(samples)[f"set {WARM_UP}"]
    growth = max(rss for _, rss in samples[WARM_UP + 1:]) - warm
    assert growth <= ANALYSIS_LIMIT + JOB_LIMIT + ALLOWANCE, (
        f"resident memory grew {growth / MB:.0f} MB after the warm-up (limits {ANALYSIS_LIMIT / MB:.0f} MB + "
        f"{JOB_LIMIT / MB:.2f} MB): {table}")

"""In a real browser (streamlit + headless chromium): the Sweep page's charts and Tune's measured A | B draw their
standard errors as error bars, the sweep's grid-edge warnings and pairwise comparisons show, at 1000 px light and
1400 px dark, with the paper's long model names on the Sweep page. Full-page screenshots go to
test-artifacts/noise/ (sweep-<width>-<scheme>.png, tune-ab-<width>-<scheme>.png) to be looked at."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.app_helpers import APP_MAIN, app_env
from tests.browser.chromium import ARGS, CHROMIUM, needs_chromium
from tests.make_screenshots import paper_named_copies, select_long_names, settle

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "noise"
# Seven candidates of three methods (a grid of three values draws Table 2's lines; two-value grids put every best at an
# edge, which the page warns about) on 20 examples per task: what the page shows, at a fraction of a full sweep's cost.
GRIDS = ("grids:\n  - task_arithmetic lambda=0.5,1.0\n  - ties lambda=1.0 density=0.1,0.2\n"
         "  - ram_plus r=0,0.1,0.2\n")
EXAMPLES = 20

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [needs_chromium, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import socket

    tmp = tmp_path_factory.mktemp("noise-browser")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, **app_env(tmp, use_real_demo=True)}
    log = open(tmp / "streamlit.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(APP_MAIN), "--server.port", str(port),
                             "--server.headless", "true", "--server.address", "127.0.0.1"],
                            cwd=APP_MAIN.parent.parent, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.3)
    yield {"url": url, "folders": paper_named_copies(tmp / "paper-names")}
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    log.close()


def error_bars(pg) -> int:
    """How many error-bar marks plotly drew on the page."""
    return pg.locator('[data-testid="stPlotlyChart"] g.errorbar path').count()


def open_page(pg, title: str) -> None:
    pg.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first.click()
    pg.get_by_role("heading", name=title, level=1).wait_for()
    settle(pg)


def shoot(pg, path: Path, width: int, top_heading: str | None = None) -> None:
    """The whole page (or from `top_heading` down), the viewport grown to the page's height."""
    h = pg.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
    pg.set_viewport_size({"width": width, "height": int(h) + 20})
    settle(pg)
    clip = None
    if top_heading:
        y = pg.get_by_role("heading", name=top_heading).bounding_box()["y"] - 10
        clip = {"x": 0, "y": y, "width": width, "height": int(h) + 20 - y}
    pg.screenshot(path=str(path), clip=clip)
    pg.set_viewport_size({"width": width, "height": 900})


def tune_measured(pg) -> None:
    """Tune on the demo trio: score settings A and B, wait for the measured table and chart."""
    open_page(pg, "Tune")
    pg.get_by_role("button", name="Score A and B on the demo tasks").click()
    pg.get_by_text("B − A is paired per example").wait_for(timeout=1_500_000)
    pg.locator('[data-testid="stPlotlyChart"] g.errorbar').first.wait_for()
    settle(pg)


def sweep_long_names(pg, folders) -> None:
    """The paper-named copies, a sweep of GRIDS on the demo's tasks (EXAMPLES per task), its results."""
    select_long_names(pg, folders)
    open_page(pg, "Sweep")
    if not pg.get_by_role("radio", name="Demo tasks").is_checked():
        pg.get_by_text("Demo tasks", exact=True).first.click()
        settle(pg)
    pg.get_by_text("Grids as YAML").click()
    pg.get_by_role("textbox", name="Paste grids (YAML) to replace these").fill(GRIDS)
    pg.get_by_role("button", name="Load the pasted grids").click()
    settle(pg)
    pg.get_by_text("Grids as YAML").click()
    box = pg.get_by_role("spinbutton", name="Examples per task (0: all)")
    box.fill(str(EXAMPLES))
    box.press("Enter")
    settle(pg)
    pg.get_by_role("button", name="Start sweep").click()
    pg.get_by_text("candidates scored on validation, the").wait_for(timeout=1_500_000)
    pg.locator('[data-testid="stPlotlyChart"] .main-svg').first.wait_for()
    settle(pg)


def as_seen_at(pg, width: int, scheme: str) -> None:
    """The same page in another window width and system colour scheme: it measures its new width and recolours
    itself (each a rerun), then settles."""
    pg.set_viewport_size({"width": width, "height": 900})
    pg.emulate_media(color_scheme=scheme)
    settle(pg)


def test_error_bars_on_the_sweep_page_and_tunes_a_b(server):
    """Both pages at 1000 px light and 1400 px dark: each scored once, then seen in the other window and scheme."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        ctx = browser.new_context(viewport={"width": 1000, "height": 900}, color_scheme="light")
        pg = ctx.new_page()
        pg.set_default_timeout(180_000)
        pg.goto(server["url"])
        pg.wait_for_selector('[data-testid="stAppViewContainer"]')
        settle(pg)
        tune_measured(pg)
        for width, scheme in ((1000, "light"), (1400, "dark")):
            as_seen_at(pg, width, scheme)
            assert error_bars(pg) >= 8  # A and B, three tasks and the average
            assert pg.locator('[data-testid="stException"]').count() == 0
            shoot(pg, ARTIFACTS / f"tune-ab-{width}-{scheme}.png", width, "Compare two settings: A | B")
        sweep_long_names(pg, server["folders"])
        for width, scheme in ((1400, "dark"), (1000, "light")):
            as_seen_at(pg, width, scheme)
            assert pg.locator('[data-testid="stException"]').count() == 0
            assert error_bars(pg) > 0
            pg.get_by_text("Score vs parameter (Table 2 view)").click()  # a tab: the Table 2 chart
            settle(pg)
            assert error_bars(pg) > 0
            assert pg.get_by_text("The chosen candidates against each other on test").count() == 1
            shoot(pg, ARTIFACTS / f"sweep-{width}-{scheme}.png", width)
        ctx.close()
        browser.close()

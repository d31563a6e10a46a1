"""End to end in a real browser: `streamlit run app/main.py` + headless system chromium (Playwright, sync API).

Screenshots of every page (1280×800) go to test-artifacts/ (git-ignored).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.app_helpers import APP_MAIN, app_env

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
ROOT = APP_MAIN.parent.parent

sync_api = pytest.importorskip("playwright.sync_api")
# CI sets RAM_STUDIO_REQUIRE_BROWSER: there a missing chromium fails the tests instead of skipping them.
REQUIRED = bool(os.environ.get("RAM_STUDIO_REQUIRE_BROWSER"))
pytestmark = [pytest.mark.skipif(not Path(CHROMIUM).exists() and not REQUIRED, reason="system chromium not installed"),
              pytest.mark.timeout(300)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    env = {**os.environ, **app_env(tmp)}
    port = free_port()
    log = open(tmp / "streamlit.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(APP_MAIN), "--server.port", str(port),
                             "--server.headless", "true", "--server.address", "127.0.0.1"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.3)
        if proc.poll() is not None:
            break
    else:
        proc.terminate()
        pytest.fail("streamlit did not start within 60 s: " + (tmp / "streamlit.log").read_text()[-2000:])
    if proc.poll() is not None:
        pytest.fail("streamlit exited: " + (tmp / "streamlit.log").read_text()[-2000:])
    yield {"url": url, "tmp": tmp}
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def page(server):
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        ctx = browser.new_context(viewport={"width": 1280, "height": 800}, device_scale_factor=1)
        pg = ctx.new_page()
        pg.set_default_timeout(60_000)
        yield pg
        ctx.close()
        browser.close()


def shoot(pg, name: str) -> None:
    """Viewport (1280×800) and full-page screenshots, once the app has stopped running."""
    settle(pg)
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    # Streamlit scrolls inside its own container: grow the viewport to capture the whole page once.
    height = pg.evaluate("Math.max(...[...document.querySelectorAll('[data-testid=stMain], section')]"
                         ".map(e => e.scrollHeight), 800)")
    pg.set_viewport_size({"width": 1280, "height": min(int(height) + 40, 6000)})
    settle(pg)
    pg.screenshot(path=str(ARTIFACTS / f"{name}-full.png"))
    pg.set_viewport_size({"width": 1280, "height": 800})


def settle(pg, timeout: float = 60) -> None:
    """Wait until the script run finished (no 'Running…' status widget) and plots have drawn."""
    deadline = time.time() + timeout
    pg.wait_for_timeout(400)
    while time.time() < deadline:
        if pg.locator('[data-testid="stStatusWidget"]').count() == 0:
            break
        pg.wait_for_timeout(200)
    pg.wait_for_timeout(800)


def goto(pg, server, title: str) -> None:
    """Open a page through the sidebar (same browser session, so Tune's choices reach Merge)."""
    if not pg.url.startswith(server["url"]):
        pg.goto(server["url"])
        pg.wait_for_selector('[data-testid="stAppViewContainer"]')
    link = pg.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first
    try:
        link.wait_for(timeout=15_000)
    except Exception:
        pg.screenshot(path=str(ARTIFACTS / f"nav-failure-{title}.png"))
        raise
    link.click()
    pg.get_by_role("heading", name=title, level=1).wait_for()


def test_app_loads_with_charts(page, server):
    goto(page, server, "Heterogeneity")
    page.locator('[data-testid="stPlotlyChart"]').nth(4).wait_for(timeout=120_000)
    assert page.locator('[data-testid="stPlotlyChart"]').count() >= 5
    page.locator('[data-testid="stPlotlyChart"] .main-svg').first.wait_for()
    assert page.locator('[data-testid="stException"]').count() == 0
    shoot(page, "heterogeneity")
    with page.expect_download() as download:  # every chart's data comes as CSV
        page.locator('[data-testid="stDownloadButton"]').filter(has_text="CSV").first.click()
    assert download.value.suggested_filename == "density_per_agent.csv"
    assert "density" in Path(download.value.path()).read_text().splitlines()[0]


def test_models_page(page, server):
    goto(page, server, "Models")
    page.get_by_text("Compatible:").wait_for()
    assert page.locator('[data-testid="stException"]').count() == 0
    shoot(page, "models")


def lambda_text(pg) -> str:
    return pg.locator('[data-testid="stTable"]').first.inner_text()


def test_r_slider_changes_lambda_table(page, server):
    goto(page, server, "Tune")
    page.locator('[data-testid="stTable"]').first.wait_for()
    page.locator('[data-testid="stPlotlyChart"]').nth(1).wait_for()
    settle(page)
    before = lambda_text(page)
    slider = page.locator('[data-testid="stSlider"]').filter(has_text="r (rescale strength)")
    thumb = slider.get_by_role("slider")
    thumb.focus()
    for _ in range(10):
        thumb.press("ArrowRight")
    deadline = time.time() + 30
    while time.time() < deadline and lambda_text(page) == before:
        page.wait_for_timeout(200)
    after = lambda_text(page)
    assert after != before, "moving r did not change the λ_t table"
    assert "0.20" in slider.inner_text()
    server["r_tuned"] = True
    shoot(page, "tune")


def test_dilution_page(page, server):
    goto(page, server, "Signal dilution")
    page.locator('[data-testid="stPlotlyChart"]').nth(1).wait_for()
    assert page.locator('[data-testid="stException"]').count() == 0
    shoot(page, "dilution")


def test_merge_from_ui(page, server):
    out = server["tmp"] / "merged" / "ui-merge"
    goto(page, server, "Merge & export")
    box = page.get_by_role("textbox", name="Output folder")
    box.wait_for()
    box.fill(str(out))
    box.press("Enter")
    settle(page)
    if server.get("r_tuned"):
        r_box = page.get_by_role("spinbutton", name="r", exact=True)
        assert abs(float(r_box.input_value()) - 0.2) < 1e-9, "Merge is not pre-filled with Tune's r"
    page.get_by_role("button", name="Start merge").click()
    page.get_by_text("Merged into").wait_for(timeout=120_000)
    assert out.is_dir()
    assert (out / "config.json").exists() and any(out.glob("*.safetensors"))
    assert page.locator('[data-testid="stException"]').count() == 0
    shoot(page, "merge")

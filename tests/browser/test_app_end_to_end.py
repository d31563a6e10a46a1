"""End to end in a real browser: `streamlit run app/main.py` + headless system chromium (Playwright, sync API).

One server for the module, started with a local stand-in for the Hugging Face Hub (HF_ENDPOINT), so the
download panel runs for real. Behaviours are grouped into few page visits (browser time is the expensive
part of CI). Screenshots of every page (1280×800) go to test-artifacts/ (git-ignored).
"""
from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.app_helpers import APP_MAIN, app_env, open_page_by_link
from tests.browser.chromium import ARGS, CHROMIUM, needs_chromium
from tests.paths import REPO_ROOT

ARTIFACTS = REPO_ROOT / "test-artifacts"
ROOT = APP_MAIN.parent.parent

sync_api = pytest.importorskip("playwright.sync_api")
# CI sets RAM_STUDIO_REQUIRE_BROWSER: there a missing chromium fails the tests instead of skipping them.
pytestmark = [needs_chromium, pytest.mark.timeout(300)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.app_helpers import build_demo
    from tests.hub_stand_in import StandInHub

    tmp = tmp_path_factory.mktemp("browser")
    hub = StandInHub()
    family = build_demo(tmp / "hub-family")
    for name in ("base", "code", "tool"):
        hub.add_repo(f"org/{name}", family / name)
    hub.start()
    env = {**os.environ, **app_env(tmp), "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp / "hf-cache"),
           "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        env.pop(k, None)
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
    yield {"url": url, "tmp": tmp, "hub": hub}
    hub.stop()
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
        # the root forwards to Heterogeneity: a link clicked before the forward lands would be overtaken by it
        pg.wait_for_url(lambda u: u.split("?")[0].rstrip("/").endswith("/heterogeneity"))
        pg.get_by_role("heading", name="Heterogeneity", level=1).wait_for()
        # and for the run the browser's first width report starts: a click landing during it can be overtaken by it
        settle(pg)
    link = pg.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first
    try:
        link.wait_for(timeout=15_000)
    except Exception:
        pg.screenshot(path=str(ARTIFACTS / f"nav-failure-{title}.png"))
        raise
    open_page_by_link(pg, title)


def test_app_loads_with_charts(page, server):
    goto(page, server, "Heterogeneity")
    page.locator('[data-testid="stPlotlyChart"]').nth(4).wait_for(timeout=120_000)
    assert page.locator('[data-testid="stPlotlyChart"]').count() >= 5
    page.locator('[data-testid="stPlotlyChart"] .main-svg').first.wait_for()
    assert page.locator('[data-testid="stException"]').count() == 0
    assert page.locator("[class*='st-key-plotly_loader-']").count() == 0  # the hidden loader went with the pass
    shoot(page, "heterogeneity")
    name = "density_per_agent__eps-1e-5__agents-code+memory+tool"
    with page.expect_download() as download:  # every chart's data comes as CSV, named like the figure
        page.locator('[data-testid="stDownloadButton"]').filter(has_text="CSV").first.click()
    assert download.value.suggested_filename == f"{name}.csv"
    assert "density" in Path(download.value.path()).read_text().splitlines()[0]

    # The camera button: a titled PNG at print scale, named after the chart and its parameters …
    png = figure_download(page, 0)
    assert png.suggested_filename == f"{name}.png"
    data = Path(png.path()).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">I", data[16:20])[0] == 3000  # 1000 px × 3
    # … or an SVG, chosen in the sidebar, with the title and the parameters in it.
    page.locator('[data-testid="stSidebar"]').get_by_text("SVG").click()
    page.wait_for_timeout(1000)
    settle(page)
    svg = figure_download(page, 0)
    assert svg.suggested_filename == f"{name}.svg"
    text = Path(svg.path()).read_text()
    assert text.lstrip().startswith("<svg") and "Density per agent" in text and "ε = 1e-5" in text
    page.locator('[data-testid="stSidebar"]').get_by_text("PNG (print, 3×)").click()
    settle(page)


def figure_download(pg, index: int):
    """Click the camera button of the index-th chart's toolbar and return the download (the chart may be
    redrawn by a rerun meanwhile: then it is found again)."""
    for attempt in range(4):
        try:
            chart = pg.locator('[data-testid="stPlotlyChart"]').nth(index)
            chart.scroll_into_view_if_needed(timeout=10_000)
            chart.hover()
            button = chart.locator('.modebar-btn[data-title^="Download plot"]')
            button.wait_for(state="visible", timeout=10_000)
            with pg.expect_download(timeout=30_000) as download:
                button.click()
            return download.value
        except sync_api.Error:
            if attempt == 3:
                raise
            settle(pg)


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
    slider = page.locator('[data-testid="stSlider"]').filter(has_text="r (rescale strength)").first  # A, not B
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
    # A | B: B's own controls redraw only the comparison (its table has both settings' λ_t)
    ab = page.locator('[data-testid="stTable"]').filter(has_text="λ_t B")
    ab.wait_for()
    settle(page)
    before_ab, a_table = ab.inner_text(), lambda_text(page)
    page.locator('[data-testid="stRadio"]').filter(has_text="λ rule").nth(1).get_by_text("soft").click()
    deadline = time.time() + 30
    while time.time() < deadline and ab.inner_text() == before_ab:
        page.wait_for_timeout(200)
    assert ab.inner_text() != before_ab, "changing B's rule did not change the A | B table"
    assert lambda_text(page) == a_table  # A is untouched
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
        r_box = page.get_by_role("spinbutton", name="r (rescale strength)", exact=True)
        assert abs(float(r_box.input_value()) - 0.2) < 1e-9, "Merge is not pre-filled with Tune's r"
    page.get_by_role("button", name="Start merge").click()
    page.get_by_text("Merged into").wait_for(timeout=120_000)
    assert out.is_dir()
    assert (out / "config.json").exists() and any(out.glob("*.safetensors"))
    assert page.locator('[data-testid="stException"]').count() == 0
    shoot(page, "merge")


def test_fast_failures_never_leave_the_form_disabled(page, server):
    """A merge that fails at once — here unique_only naming no agent, which
    fails inside the job — must give back an enabled form, Overwrite box included, every time."""
    goto(page, server, "Merge & export")
    method = page.locator('[data-testid="stSelectbox"]').filter(has_text="Method")
    method.click()
    page.get_by_role("option", name="unique_only", exact=False).first.click()
    settle(page)
    agent = page.get_by_role("textbox", name="agent", exact=True)
    agent.fill("no-such-agent")
    agent.press("Enter")
    box = page.get_by_role("textbox", name="Output folder")
    box.fill(str(server["tmp"] / "fast-failure"))
    box.press("Enter")
    settle(page)
    start = page.get_by_role("button", name="Start merge")
    overwrite = page.get_by_role("checkbox", name="Overwrite an existing folder")
    for attempt in range(7):
        start.click()
        try:
            page.locator('[data-testid="stAlert"]').filter(has_text="no-such-agent").wait_for(timeout=30_000)
        except sync_api.Error:
            page.screenshot(path=str(ARTIFACTS / "fast-failure.png"), full_page=True)
            raise
        # Never left disabled: within 10 s the form is enabled and stays so for 1.5 s on end (a page that follows
        # the failed job may redraw once more, briefly disabled, while the job's thread finishes).
        deadline, steady_since = time.time() + 10, None
        while time.time() < deadline:
            if start.is_enabled() and overwrite.is_enabled():
                steady_since = steady_since or time.time()
                if time.time() - steady_since >= 1.5:
                    break
            else:
                steady_since = None
            page.wait_for_timeout(100)
        assert steady_since is not None and time.time() - steady_since >= 1.5, \
            f"form still disabled after try {attempt + 1}"
        assert page.locator('[data-testid="stAlert"]').filter(has_text="no-such-agent").count() == 1  # not stacked
    assert page.locator('[data-testid="stException"]').count() == 0


def test_hub_download_in_the_browser(page, server):
    """Models page against the stand-in Hub: the plan (size, where), a download with live progress, then the
    models are in the cache."""
    hub = server["hub"]
    goto(page, server, "Models")
    page.get_by_text("Custom: local folders or Hub ids").click()
    base = page.get_by_role("textbox", name="Base model")
    base.fill("org/base")
    base.press("Enter")
    agents = page.get_by_role("textbox", name="Agents (one per line)")
    agents.fill("org/code\norg/tool")
    agents.press("Control+Enter")
    settle(page)
    page.get_by_role("button", name="Check compatibility").click()
    page.get_by_text("Compatible:").wait_for(timeout=60_000)
    page.get_by_text("Hugging Face cache").first.wait_for()
    hub.rate = 100_000
    try:
        page.locator(".st-key-download_start button").click()
    except sync_api.Error:
        page.screenshot(path=str(ARTIFACTS / "download-failure.png"), full_page=True)
        raise
    page.get_by_text("Overall:").first.wait_for(timeout=30_000)
    shoot(page, "models-downloading")
    hub.rate = None
    page.get_by_text("Downloaded:").wait_for(timeout=120_000)
    assert (server["tmp"] / "hf-cache" / "models--org--tool").is_dir()
    assert page.locator('[data-testid="stException"]').count() == 0


def test_dark_mode_follows_the_browser(page, server):
    """With the browser set to dark, the app and its charts are dark (no light charts on a dark page)."""
    ctx = page.context.browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="dark")
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    pg.goto(server["url"])
    pg.locator('[data-testid="stPlotlyChart"] .main-svg').first.wait_for(timeout=120_000)
    settle(pg)

    def luminance(css: str) -> float:
        r, g, b = [int(x) for x in css[css.index("(") + 1:css.index(")")].split(",")[:3]]
        return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255

    bg = pg.evaluate("getComputedStyle(document.querySelector('[data-testid=stApp]')).backgroundColor")
    assert luminance(bg) < 0.2, bg
    title = pg.locator('[data-testid="stPlotlyChart"] .gtitle').first
    assert luminance(title.evaluate("e => getComputedStyle(e).fill")) > 0.8  # light text on the dark page
    paper = pg.locator('[data-testid="stPlotlyChart"] .main-svg .bg').first
    assert paper.evaluate("e => getComputedStyle(e).fillOpacity") in ("0", "0.0")
    pg.screenshot(path=str(ARTIFACTS / "heterogeneity-dark.png"))
    ctx.close()


def test_hostile_names_never_make_a_remote_request_or_a_link(page, server):
    """File-derived text rendered as Markdown loaded a remote image by itself (a tracking beacon)
    and showed a phishing link. Folder and tensor names full of markup go through every page — the Models
    report, every chart of Heterogeneity and Tune, Signal dilution, a merge and its results, and an error box
    quoting the tensor name — in a real browser: every request stays on the app's own server, and no link
    or image to the names' host appears."""
    from tests.factory import make_hostile_family

    base, agents = make_hostile_family(server["tmp"] / "hostile")
    bad_base, bad_agents = make_hostile_family(server["tmp"] / "hostile-nan", nan_in=1)
    requests: list[str] = []
    # A context of its own (a new session, its own request log) in the module's browser.
    ctx = page.context.browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.on("request", lambda r: requests.append(r.url))
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)

    def check(where: str) -> None:
        settle(pg)
        foreign = [u for u in requests if not u.startswith((server["url"], "data:", "blob:", "about:"))]
        assert not foreign, (where, foreign[:5])
        links = pg.locator("a[href*='127.0.0.2'], a[href*='evil.example'], area[href*='127.0.0.2']")
        images = pg.locator("img[src*='127.0.0.2'], img[src='x'], image[href*='127.0.0.2']")
        assert links.count() == 0 and images.count() == 0, (where, [links.nth(i).evaluate("e => e.outerHTML")
                                                                    for i in range(links.count())][:3])
        assert pg.get_by_role("link", name="Click to fix").count() == 0, where
        assert pg.locator("script:has-text('alert(1)')").count() == 0, where

    def select(base: Path, agents: list[Path]) -> None:
        goto(pg, server, "Models")
        pg.get_by_text("Custom: local folders or Hub ids").click()
        pg.get_by_role("textbox", name="Base model").fill(str(base))
        pg.get_by_role("textbox", name="Agents (one per line)").fill("\n".join(map(str, agents)))
        pg.keyboard.press("Control+Enter")
        settle(pg)
        pg.get_by_role("button", name="Use these models").click()
        pg.get_by_text("Selected.").wait_for()

    try:
        select(base, agents)
        check("Models")
        for title in ("Heterogeneity", "Tune", "Signal dilution"):
            pg.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True).click()
            pg.get_by_role("heading", name=title, level=1).wait_for()
            check(title)
        pg.locator('[data-testid="stSidebarNav"]').get_by_text("Merge & export", exact=True).click()
        pg.get_by_role("heading", name="Merge & export", level=1).wait_for()
        box = pg.get_by_role("textbox", name="Output folder")
        box.fill(str(server["tmp"] / "out ![x](https:127.0.0.2:9) <img src=x>"))
        box.press("Enter")
        settle(pg)
        pg.get_by_role("button", name="Start merge").click()
        pg.get_by_text("Merged into").wait_for(timeout=120_000)
        check("Merge & export")
        shoot(pg, "hostile-names-merge")
        # An error box quoting the hostile tensor name (an agent with a NaN there).
        select(bad_base, bad_agents)
        pg.locator('[data-testid="stSidebarNav"]').get_by_text("Heterogeneity", exact=True).click()
        pg.get_by_text("holds NaN").first.wait_for()
        assert pg.get_by_text("[Click to fix]", exact=False).count() >= 1  # the name is shown, as text
        check("the error box")
        shoot(pg, "hostile-names-error")
    finally:
        ctx.close()
    assert requests  # the recorder saw the app's own traffic


def test_sweep_page_start_progress_results_and_export(page, server):
    """A sweep from the page — it starts, shows progress, then results and charts; "merge & export this
    candidate" fills the Merge page with the chosen candidate."""
    goto(page, server, "Sweep")
    page.get_by_role("button", name="Ablation over r (Table 2)").click()
    settle(page)
    limit = page.get_by_role("spinbutton", name="Examples per task (0: all)")
    limit.fill("12")
    limit.press("Enter")
    settle(page)
    page.get_by_role("button", name="Start sweep").click()
    page.locator('[data-testid="stProgress"]').first.wait_for(timeout=60_000)
    page.get_by_text("scored on validation").first.wait_for(timeout=240_000)  # the progress line, then the result
    page.get_by_text("candidates scored on validation, the").wait_for(timeout=240_000)
    page.locator('[data-testid="stPlotlyChart"] .main-svg').first.wait_for(timeout=60_000)
    settle(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    shoot(page, "sweep")
    picked = page.locator('[data-testid="stSelectbox"]').filter(has_text="Candidate").locator("input").input_value()
    assert "ram_plus r=" in picked, picked
    r = float(picked.split("ram_plus r=")[1].split()[0])
    page.get_by_role("button", name="Merge & export this candidate").click()
    page.get_by_role("heading", name="Merge & export", level=1).wait_for()
    settle(page)
    assert page.locator('[data-testid="stSelectbox"]').filter(has_text="Method").locator("input").input_value() \
        .startswith("ram_plus —")
    assert abs(float(page.get_by_role("spinbutton", name="r (rescale strength)", exact=True).input_value()) - r) < 1e-9
    assert page.locator('[data-testid="stException"]').count() == 0


def test_a_reload_keeps_the_models_the_analysis_and_the_merge(page, server):
    """The selection lives in the URL, so a reload (a new session) opens the same models with the
    server's cached analysis; the Merge page re-attaches to the merge the old session ran, and owns its folder."""
    from urllib.parse import parse_qs, urlparse

    goto(page, server, "Models")
    page.get_by_text("Custom: local folders or Hub ids").click()
    base = page.get_by_role("textbox", name="Base model")
    base.fill("demo:base")
    agents = page.get_by_role("textbox", name="Agents (one per line)")
    agents.fill("demo:memory\ndemo:code")
    base.click()  # leave the text area so its value is sent
    settle(page)
    page.get_by_role("button", name="Use these models").click()
    page.get_by_text("Selected.").wait_for()
    goto(page, server, "Heterogeneity")
    page.locator('[data-testid="stPlotlyChart"]').nth(4).wait_for(timeout=120_000)
    query = parse_qs(urlparse(page.url).query)
    assert query["base"] == ["demo:base"] and query["agent"] == ["demo:memory", "demo:code"], page.url

    page.reload()
    page.get_by_role("heading", name="Heterogeneity", level=1).wait_for()
    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("analysis ready").wait_for(timeout=120_000)  # the server's cached analysis, not a new pass
    settle(page)
    sidebar.locator("code").nth(2).wait_for()
    assert sidebar.locator("code").all_inner_texts() == ["base", "memory", "code"]
    # the charts come after the sidebar (the page draws them from the cached analysis): at least five of them
    page.locator('[data-testid="stPlotlyChart"]').nth(4).wait_for(timeout=120_000)

    out = server["tmp"] / "merged" / "reload-merge"
    goto(page, server, "Merge & export")
    box = page.get_by_role("textbox", name="Output folder")
    box.fill(str(out))
    box.press("Enter")
    page.get_by_text("Your folder.").wait_for()  # the typed folder is in use (not the suggestion)
    settle(page)
    page.get_by_role("button", name="Start merge").click()
    page.get_by_text("Merged into").wait_for(timeout=120_000)
    assert (out / "ram_recipe.json").exists(), page.locator('[data-testid="stAlert"]').all_inner_texts()
    assert "job=" in page.url
    page.reload()
    page.get_by_role("heading", name="Merge & export", level=1).wait_for()
    page.get_by_text("Merged into").wait_for(timeout=120_000)  # the finished job, re-attached
    box = page.get_by_role("textbox", name="Output folder")
    box.fill(str(out))
    box.press("Enter")
    page.get_by_text("Your folder.").wait_for()  # the typed folder is in use (not the suggestion)
    settle(page)
    page.locator('[data-testid="stCheckbox"]').filter(has_text="Overwrite an existing folder").click()
    settle(page)
    assert page.get_by_role("checkbox", name="Overwrite an existing folder").is_checked()
    before = (out / "ram_recipe.json").stat().st_mtime_ns
    page.get_by_role("button", name="Start merge").click()
    deadline = time.time() + 120  # the old result stays on the page until the new one replaces it: watch the folder
    while time.time() < deadline and (out / "ram_recipe.json").stat().st_mtime_ns == before \
            and page.get_by_text("written by another session").count() == 0:
        page.wait_for_timeout(200)
    settle(page)
    if (out / "ram_recipe.json").stat().st_mtime_ns == before:
        shoot(page, "merge-after-reload-failure")
        alerts = page.locator('[data-testid="stAlert"]').all_inner_texts()
        raise AssertionError(f"the merge after the reload did not run: {alerts}")
    page.get_by_text("Merged into").wait_for(timeout=120_000)
    assert page.get_by_text("written by another session").count() == 0
    assert page.locator('[data-testid="stException"]').count() == 0
    assert (out / "ram_recipe.json").stat().st_mtime_ns != before  # written again by the new session
    shoot(page, "merge-after-reload")

    # After a finished merge, "Load into the form" keeps the mergekit panel open with its
    # confirmation; the same models in another order keep "analysis ready" and say what changed.
    page.locator('[data-testid="stExpander"]').filter(has_text="mergekit YAML").locator("summary").click()
    area = page.get_by_role("textbox", name="Paste a mergekit YAML")
    area.wait_for()
    area.fill("merge_method: ram\nbase_model: demo:base\nmodels:\n  - model: demo:code\n  - model: demo:memory\n")
    page.get_by_role("heading", name="Merge & export", level=1).click()  # leave the text area: its value is sent
    settle(page)
    page.get_by_role("button", name="Load into the form").click()
    settle(page)
    loaded = page.locator('[data-testid="stAlert"]').filter(has_text="Loaded")
    loaded.wait_for(timeout=30_000)
    assert loaded.is_visible() and area.is_visible(), "the panel closed after loading"
    assert "in the YAML's order" in loaded.inner_text()
    sidebar.get_by_text("analysis ready").wait_for(timeout=10_000)
    assert sidebar.locator("code").all_inner_texts() == ["base", "code", "memory"]
    shoot(page, "merge-yaml-loaded")

"""Every chart and every table of the app, at the window widths people use (1000, 1280, 1400 and 1920 px, the
sidebar open), light and dark, with 2, 3 and 8 agents named like the paper's: one Streamlit server runs the chart
gallery (tests/browser/chart_gallery.py: the app's own chart builders, `charts.show` and table frames on a real
analysis), headless chromium resizes the window, the page measures its width and lays everything out again, and
tests/browser/layout_checks.py measures what is drawn. Fails on any overlap, cut text, hidden column or text under
10 px; the failing page's screenshot goes to test-artifacts/."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.app_helpers import start_server, stop_server
from tests.browser.chromium import ARGS, CHROMIUM, needs_chromium

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
GALLERY = Path(__file__).with_name("chart_gallery.py")
WIDTHS = (1000, 1280, 1400, 1920)
CHARTS = 29  # tests/chart_cases.py's 21 and tests/browser/gallery_cases.py's 8
SIDEBAR_AND_PADDING = 460  # the window less the main column's content: sidebar 300 px, padding 2 × 80 px

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [needs_chromium, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def gallery(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gallery")
    env = {**os.environ, "RAM_STUDIO_CACHE": str(tmp / "cache"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc, url = start_server(tmp, env, script=GALLERY)
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def browser():
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        # scroll bars as people see them: Playwright hides them by default, which would hide a table's only cue
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True,
                              ignore_default_args=["--hide-scrollbars"])
        yield b
        b.close()


def settle(pg, timeout: float = 240) -> None:
    """Until no script runs, no element is stale and the page's height has stayed the same for 1 s (a run draws
    every chart before it ends, and plotly draws each as it arrives: a page with no run, nothing stale and a
    steady height has drawn everything)."""
    deadline, last, stable = time.time() + timeout, None, 0
    while time.time() < deadline and stable < 4:
        pg.wait_for_timeout(250)
        h = pg.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
        busy = pg.locator('[data-testid="stStatusWidget"]').count() > 0 or pg.evaluate(
            "document.querySelectorAll('[data-stale=true]').length") > 0
        stable = stable + 1 if h == last and not busy else 0
        last = h


def laid_out_for(pg, width: int) -> int:
    """Wait until the page has measured this window's main column and drawn every chart for it; its width."""
    caption = pg.locator('[data-testid="stMain"] [data-testid="stCaptionContainer"]').first
    deadline = time.time() + 240
    while time.time() < deadline:
        text = caption.inner_text() if caption.count() else ""
        if "(measured)" in text and abs(int(text.split()[2]) - (width - SIDEBAR_AND_PADDING)) <= 16:
            break
        pg.wait_for_timeout(250)
    else:
        raise AssertionError(f"the page did not measure a {width} px window: {caption.inner_text()!r}")
    pg.wait_for_function(f"document.querySelectorAll('[data-testid=stPlotlyChart] .main-svg').length >= {CHARTS} && "
                         "document.querySelectorAll('[data-testid=stDataFrame]').length >= 7", timeout=240_000)
    settle(pg)
    return int(caption.inner_text().split()[2])


# The page's background and every chart's ink and paper, as drawn: what a switch of the scheme must change.
COLOURS = """() => ({page: getComputedStyle(document.querySelector('[data-testid=stApp]')).backgroundColor,
  charts: [...document.querySelectorAll('[data-testid=stPlotlyChart] .js-plotly-plot')]
    .map(d => d._fullLayout ? [d._fullLayout.font.color, d._fullLayout.paper_bgcolor] : null)})"""


def dark_page(rgb: str) -> bool:
    return sum(int(v) for v in rgb[rgb.index("(") + 1:rgb.index(")")].split(",")[:3]) < 3 * 128


def switch_scheme(pg, scheme: str) -> None:
    """The system's colour scheme switched, as a user would: the page recolours itself and reruns (the viewport
    component reports the switch), and every chart is drawn again in the scheme's colours; fails if not."""
    from app.charts.base import THEMES

    ink, paper = THEMES[scheme]["ink"].lower(), THEMES[scheme]["paper"].lower()
    pg.emulate_media(color_scheme=scheme)
    deadline = time.time() + 240
    while time.time() < deadline:
        seen = pg.evaluate(COLOURS)
        charts = seen["charts"]
        if (dark_page(seen["page"]) == (scheme == "dark") and len(charts) >= CHARTS
                and all(c and c[0].lower() == ink and c[1].replace(" ", "").lower() == paper for c in charts)):
            break
        pg.wait_for_timeout(250)
    else:
        raise AssertionError(f"the page and its charts did not switch to {scheme}: {seen}")
    settle(pg)


def side_by_side(pg, a: str, b: str) -> bool:
    boxes = [pg.locator(f".st-key-chart_{k}").first.bounding_box() for k in (a, b)]
    return abs(boxes[0]["y"] - boxes[1]["y"]) < 5 and boxes[0]["x"] != boxes[1]["x"]


def problems_at(pg, n: int, main: int) -> dict[str, list[str]]:
    """Everything unreadable on the page as drawn, and a pair of charts side by side where it should not be
    (or the reverse): a pair stands side by side only where both get PAIR_PX."""
    from app.charts import PAIR_PX
    from tests.browser.layout_checks import page_problems

    problems = page_problems(pg)
    pair = n <= 3 and (main - 16) / 2 >= PAIR_PX
    if side_by_side(pg, "density_per_agent", "overlap_distribution") != pair:
        problems["pairs"] = [f"pair side by side should be {pair} at {main} px"]
    return problems


def screenshot(pg, name: str, width: int) -> None:
    """The whole page, for the reader of a failure."""
    h = pg.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
    pg.set_viewport_size({"width": width, "height": min(int(h) + 20, 30_000)})
    settle(pg)
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    pg.set_viewport_size({"width": width, "height": 900})


@pytest.mark.parametrize("n", [2, 3, 8])
def test_every_chart_and_table_is_readable_at_every_width(gallery, browser, n):
    """One page per agent count: at each width it is laid out once and checked in both schemes (the system's
    scheme switched in between, and the charts drawn again in it); the scheme the previous width ended in comes
    first, so a width costs one layout and one switch."""
    ctx = browser.new_context(viewport={"width": WIDTHS[0], "height": 900}, color_scheme="light")
    pg = ctx.new_page()
    pg.set_default_timeout(240_000)
    found, checked, scheme = {}, [], "light"
    try:
        pg.goto(f"{gallery}/?n={n}")
        for width in WIDTHS:
            pg.set_viewport_size({"width": width, "height": 900})
            main = laid_out_for(pg, width)
            for turn in range(2):
                if turn:
                    scheme = "dark" if scheme == "light" else "light"
                    switch_scheme(pg, scheme)
                problems = problems_at(pg, n, main)
                checked.append((width, scheme))
                if problems:
                    found[f"{width}-{scheme}"] = problems
                    screenshot(pg, f"chart-layout-{n}-{scheme}-{width}", width)
    finally:
        ctx.close()
    assert sorted(checked) == sorted((w, s) for w in WIDTHS for s in ("light", "dark")), checked
    assert not found, found

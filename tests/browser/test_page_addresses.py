"""In a real browser on `streamlit run app/main.py`: every page opens by its own address with the models its link
names (and the root address forwards to Heterogeneity, keeping them); the sidebar lists the models a page uses as
soon as "Use these models" selects them; a mistyped path is said once; every page at 1000 px (the narrowest
supported window, sidebar open) has nothing overlapping, cut or hidden (tests/browser/layout_checks.py)."""
from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from tests.app_helpers import app_env, start_server, stop_server
from tests.browser.chromium import ARGS, CHROMIUM, needs_chromium

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PAGES = {"models": "Models", "heterogeneity": "Heterogeneity", "tune": "Tune", "dilution": "Signal dilution",
         "sweep": "Sweep", "merge": "Merge & export"}
LINK = "base=demo:base&agent=demo:code&agent=demo:tool"  # two of the demo's three agents

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [needs_chromium, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("addresses")
    proc, url = start_server(tmp, {**os.environ, **app_env(tmp)})
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def browser():
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True,
                              ignore_default_args=["--hide-scrollbars"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1000, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(120_000)
    yield pg
    ctx.close()


def settle(pg, timeout: float = 180) -> None:
    """Until no script runs, nothing is stale and the page's height has stayed the same for 2 s."""
    deadline, last, stable = time.time() + timeout, None, 0
    while time.time() < deadline and stable < 8:
        pg.wait_for_timeout(250)
        h = pg.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
        busy = pg.locator('[data-testid="stStatusWidget"]').count() > 0 or pg.evaluate(
            "document.querySelectorAll('[data-stale=true]').length") > 0
        stable = stable + 1 if h == last and not busy else 0
        last = h


def sidebar_models(pg) -> list[str]:
    return pg.locator('[data-testid="stSidebar"] code').all_inner_texts()


def test_every_page_opens_by_its_address_with_the_links_models(server, page):
    from tests.browser.layout_checks import page_problems

    page.goto(f"{server}/?{LINK}")  # the root forwards to Heterogeneity, with the models
    page.get_by_role("heading", name="Heterogeneity", level=1).wait_for()
    assert urlparse(page.url).path == "/heterogeneity", page.url
    assert parse_qs(urlparse(page.url).query)["agent"] == ["demo:code", "demo:tool"], page.url
    problems = {}
    for path, title in PAGES.items():
        page.goto(f"{server}/{path}?{LINK}")
        page.get_by_role("heading", name=title, level=1).wait_for()
        settle(page)
        assert page.get_by_text("Page not found").count() == 0, path
        assert urlparse(page.url).path == f"/{path}", (path, page.url)
        assert sidebar_models(page) == ["base", "code", "tool"], (path, sidebar_models(page))
        assert page.locator('[data-testid="stException"]').count() == 0, path
        found = page_problems(page)  # at 1000 px, the narrowest supported window
        if found:
            problems[path] = found
            page.screenshot(path=str(ARTIFACTS / f"page-1000-{path}.png"), full_page=True)
    assert not problems, problems


def choose(pg, base: str, agents: list[str]) -> None:
    pg.get_by_text("Custom: local folders or Hub ids").click()
    box = pg.get_by_role("textbox", name="Base model")
    box.fill(base)
    area = pg.get_by_role("textbox", name="Agents (one per line)")
    area.fill("\n".join(agents))
    box.click()  # leave the text area so its value is sent
    settle(pg)
    pg.get_by_role("button", name="Use these models").click()
    settle(pg)


def test_the_sidebar_shows_the_models_as_soon_as_they_are_selected(server, page):
    page.goto(f"{server}/models?{LINK}")
    page.get_by_role("heading", name="Models", level=1).wait_for()
    settle(page)
    assert sidebar_models(page) == ["base", "code", "tool"]
    choose(page, "demo:base", ["demo:memory", "demo:code"])
    page.get_by_text("Selected.").wait_for()
    assert sidebar_models(page) == ["base", "memory", "code"]  # on this page, not one page later
    assert parse_qs(urlparse(page.url).query)["agent"] == ["demo:memory", "demo:code"]


def test_a_mistyped_path_is_said_once(server, page, tmp_path):
    page.goto(f"{server}/models")
    page.get_by_role("heading", name="Models", level=1).wait_for()
    settle(page)
    typo = str(tmp_path / "Qwen2.5-7B-Instruct-typo")
    choose(page, "demo:base", [typo, "demo:code"])
    errors = page.locator('[data-testid="stAlertContentError"]')
    assert errors.count() == 1, errors.all_inner_texts()
    text = errors.first.inner_text()
    assert "not selected" in text and "Qwen2.5-7B-Instruct-typo" in text, text
    assert page.get_by_text("Selected.").count() == 0
    assert sidebar_models(page) == ["base", "code", "memory", "tool"]  # still the demo: nothing was selected


def test_one_resize_is_one_report_however_many_runs_came_before(server, page):
    """Every run mounts the width-measuring component again; only the newest mount listens. After several runs,
    one change of the window's width sends the server one message (one rerun of the page), not one per earlier
    mount; a quiet page sends none."""
    sent: list[float] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda _: sent.append(time.time())))
    page.goto(f"{server}/models?{LINK}")
    page.get_by_role("heading", name="Models", level=1).wait_for()
    settle(page)
    for width in (1100, 1000, 1100, 1000):  # four runs, each mounting the component again
        page.set_viewport_size({"width": width, "height": 900})
        settle(page)
    start = len(sent)
    page.wait_for_timeout(3000)
    assert len(sent) == start, f"{len(sent) - start} messages from a page nobody touched"
    page.set_viewport_size({"width": 1100, "height": 900})
    settle(page)
    assert len(sent) - start == 1, f"one resize sent {len(sent) - start} messages"

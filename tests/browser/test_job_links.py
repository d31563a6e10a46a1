"""A job's link in a real browser (streamlit + headless chromium, Playwright): a second person (another browser
context) or a duplicated tab that opens a running job's URL (`?job=`) follows it read-only while the session that
started it is open; it adopts the job only once that session has gone. A finished merge's folder stays its own
session's. Screenshots go to test-artifacts/ (git-ignored)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from app.jobs import READ_ONLY
from tests.app_helpers import app_env, start_server, stop_server
from tests.browser.chromium import ARGS, CHROMIUM, needs_chromium

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [needs_chromium, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("job-links")
    proc, url = start_server(tmp, {**os.environ, **app_env(tmp)})
    yield {"url": url, "tmp": tmp}
    stop_server(proc)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def new_page(context, url: str):
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    pg.goto(url)
    pg.wait_for_selector('[data-testid="stAppViewContainer"]')
    return pg


def settle(pg) -> None:
    """Until the script run finished (no 'Running…' status widget)."""
    deadline = time.time() + 60
    pg.wait_for_timeout(300)
    while time.time() < deadline and pg.locator('[data-testid="stStatusWidget"]').count():
        pg.wait_for_timeout(200)


def cancel(pg, name: str):
    button = pg.get_by_role("button", name=name)
    button.wait_for(timeout=90_000)
    return button


def wait_enabled(button, seconds: float = 30) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline and button.is_disabled():
        time.sleep(0.25)
    assert button.is_enabled()


def test_a_running_sweeps_link_is_read_only_until_its_session_has_gone(server, browser):
    ARTIFACTS.mkdir(exist_ok=True)
    owner = browser.new_context(viewport={"width": 1400, "height": 900})
    stranger = browser.new_context(viewport={"width": 1000, "height": 900}, color_scheme="dark")
    try:
        a = new_page(owner, f"{server['url']}/sweep")
        a.get_by_role("button", name="The paper's search (Table 11)").click()  # 45 candidates: long enough to follow
        settle(a)
        a.get_by_role("button", name="Start sweep").click()
        wait_enabled(cancel(a, "Cancel sweep"))
        link = a.url
        assert "job=" in link

        b = new_page(stranger, link)  # another person with the link
        theirs = cancel(b, "Cancel sweep")
        b.get_by_text(READ_ONLY).wait_for(timeout=30_000)
        assert theirs.is_disabled()
        twin = new_page(owner, link)  # the owner's own tab, duplicated: a new session too
        assert cancel(twin, "Cancel sweep").is_disabled()
        settle(b)
        b.screenshot(path=str(ARTIFACTS / "job-link-read-only-1000-dark.png"))
        a.wait_for_timeout(2500)  # a few polls later the owner still holds its job
        assert cancel(a, "Cancel sweep").is_enabled() and a.get_by_text(READ_ONLY).count() == 0
        a.screenshot(path=str(ARTIFACTS / "job-link-owner-1400-light.png"))
        assert b.get_by_text("Sweep cancelled").count() == 0

        owner.close()  # every tab of the owner closed: its session has gone, the follower adopts the job
        wait_enabled(cancel(b, "Cancel sweep"), 30)
        assert b.get_by_text(READ_ONLY).count() == 0
        cancel(b, "Cancel sweep").click()
        b.get_by_text("Sweep cancelled").wait_for(timeout=90_000)
        assert b.locator('[data-testid="stException"]').count() == 0
    finally:
        stranger.close()
        owner.close()  # a no-op when the test closed it


def test_a_finished_merges_link_shows_it_but_never_hands_over_its_folder(server, browser):
    out = server["tmp"] / "merged" / "linked"
    owner, stranger = browser.new_context(), browser.new_context()
    try:
        a = new_page(owner, f"{server['url']}/merge")
        box = a.get_by_role("textbox", name="Output folder")
        box.fill(str(out))
        box.press("Enter")
        a.get_by_text("Your folder.").wait_for()
        settle(a)
        a.get_by_role("button", name="Start merge").click()
        a.get_by_text("Merged into").wait_for(timeout=120_000)
        recipe = (out / "ram_recipe.json").read_bytes()

        b = new_page(stranger, a.url)
        b.get_by_text("Merged into").wait_for(timeout=60_000)  # the link shows the finished merge
        box = b.get_by_role("textbox", name="Output folder")
        box.fill(str(out))
        box.press("Enter")
        b.get_by_text("Your folder.").wait_for()
        settle(b)
        b.locator('[data-testid="stCheckbox"]').filter(has_text="Overwrite an existing folder").click()
        settle(b)
        b.get_by_role("button", name="Start merge").click()
        b.get_by_text("written by another session").wait_for(timeout=30_000)
        assert (out / "ram_recipe.json").read_bytes() == recipe
        assert b.locator('[data-testid="stException"]').count() == 0
    finally:
        stranger.close()
        owner.close()

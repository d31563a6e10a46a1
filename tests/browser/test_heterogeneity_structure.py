"""Heterogeneity in a real browser on the structures real agents have: an MoE set (Qwen3-MoE, 6 layers × 16
experts, one agent stored with fused experts) and a vision-language set (Qwen2.5-VL, one agent with the prefixed
names). `streamlit run app/main.py` + headless system chromium; full-page screenshots at 1000 and 1400 px, light
and dark (each set at both widths and in both schemes), go to test-artifacts/ (git-ignored) to be looked at."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.app_helpers import APP_MAIN, app_env
from tests.browser.chromium import ARGS, CHROMIUM, needs_chromium

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
MOE = dict(num_hidden_layers=6, num_experts=16)
VL = dict(num_hidden_layers=4)

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [needs_chromium, pytest.mark.timeout(900)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory, families):
    tmp = tmp_path_factory.mktemp("browser-structure")
    sets = {"moe": (families.base("qwen3_moe", **MOE),
                    [families.agent("qwen3_moe", 1, **MOE), families.agent("qwen3_moe", 2, "state_dict", **MOE),
                     families.agent("qwen3_moe", 3, **MOE)]),
            "vl": (families.base("qwen2_5_vl", **VL),
                   [families.agent("qwen2_5_vl", 1, **VL), families.agent("qwen2_5_vl", 2, "state_dict", **VL),
                    families.agent("qwen2_5_vl", 3, **VL)])}
    port = _free_port()
    log = open(tmp / "streamlit.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(APP_MAIN), "--server.port", str(port),
                             "--server.headless", "true", "--server.address", "127.0.0.1"],
                            cwd=APP_MAIN.parent.parent, env={**os.environ, **app_env(tmp)}, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.3)
    else:
        proc.terminate()
        pytest.fail("streamlit did not start: " + (tmp / "streamlit.log").read_text()[-2000:])
    yield {"url": url, "sets": sets}
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def browser():
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def _settle(pg, timeout: float = 240) -> None:
    """Until no script runs and the page's height stayed the same for 2 s."""
    deadline, last, stable = time.time() + timeout, None, 0
    while time.time() < deadline and stable < 8:
        pg.wait_for_timeout(250)
        h = pg.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
        busy = pg.locator('[data-testid="stStatusWidget"], [data-testid="stProgress"], '
                          '[data-testid="stSpinner"]').count() > 0
        stable = stable + 1 if (h == last and not busy) else 0
        last = h


def _open(pg, server, which: str) -> None:
    base, agents = server["sets"][which]
    query = urllib.parse.urlencode([("base", str(base))] + [("agent", str(a)) for a in agents])
    pg.goto(f"{server['url']}/?{query}")
    pg.wait_for_function("document.querySelectorAll('[data-testid=stPlotlyChart]').length >= 8", timeout=240_000)
    _settle(pg)


def _shoot(pg, name: str, width: int) -> None:
    h = pg.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
    pg.set_viewport_size({"width": width, "height": min(int(h) + 20, 16000)})
    _settle(pg)
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    pg.set_viewport_size({"width": width, "height": 900})


# A title's text as read: its lines (a title wraps to the chart's width) joined by a space.
TITLE_TEXT = ("g => g.querySelectorAll('tspan.line').length ? "
              "[...g.querySelectorAll('tspan.line')].map(t => t.textContent).join(' ') : g.textContent")


def _chart_titles(pg) -> list[str]:
    return pg.evaluate(f"[...document.querySelectorAll('[data-testid=stPlotlyChart] .gtitle')].map({TITLE_TEXT})")


def _chart(pg, title: str):
    """The chart whose title holds `title` (the last one, when several do)."""
    index = pg.evaluate("t => [...document.querySelectorAll('[data-testid=stPlotlyChart]')].map((c, i) => "
                        f"[...c.querySelectorAll('.gtitle')].some(g => ({TITLE_TEXT})(g).includes(t)) ? i : -1)"
                        ".filter(i => i >= 0).pop()", title)
    assert index is not None, title
    return pg.locator('[data-testid="stPlotlyChart"]').nth(index)


def _texts(locator) -> list[str]:
    """textContent of every element (SVG text has no innerText)."""
    return locator.evaluate_all("els => els.map(e => e.textContent)")


# Each set at both widths and in both schemes, one pairing each (a page per pairing; CI time is finite).
MOE_VIEWS = ((1000, "light"), (1400, "dark"))
VL_VIEWS = ((1000, "dark"), (1400, "light"))


def test_moe_set(browser, server):
    for width, scheme in MOE_VIEWS:
        ctx = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
        pg = ctx.new_page()
        pg.set_default_timeout(120_000)
        _open(pg, server, "moe")
        pg.get_by_role("heading", name="Mixture of experts").wait_for()
        titles = " ".join(_chart_titles(pg))
        assert "Density per layer × expert" in titles and "Which agents changed each expert" in titles
        assert "Towers" not in pg.locator('[data-testid="stHeading"]').all_inner_texts()  # one tower: no tower views
        table = pg.locator('[data-testid="stDataFrame"]').filter(has_text="routed experts changed")
        assert table.count() == 1
        heat = _chart(pg, "Density per layer × expert")
        assert heat.locator(".heatmaplayer").count() == 3  # one panel per agent
        assert "router" in _texts(heat.locator("[class$=tick] text"))  # the bottom panel's axis labels the columns
        assert pg.locator('[data-testid="stException"]').count() == 0
        _shoot(pg, f"heterogeneity-moe-{scheme}-{width}", width)
        ctx.close()


def test_vision_language_set(browser, server):
    for width, scheme in VL_VIEWS:
        ctx = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
        pg = ctx.new_page()
        pg.set_default_timeout(120_000)
        _open(pg, server, "vl")
        pg.get_by_role("heading", name="Towers").wait_for()
        titles = " ".join(_chart_titles(pg))
        assert "Density per tower" in titles and "(language tower)" in titles
        assert "Mixture of experts" not in pg.locator('[data-testid="stHeading"]').all_inner_texts()
        towers = _chart(pg, "Density per tower")
        assert set(_texts(towers.locator(".xtick text"))) == {"language", "vision"}
        _shoot(pg, f"heterogeneity-vl-{scheme}-{width}", width)
        # the per-layer views switch to the vision tower: its own blocks and kinds, never mixed with the language's
        pg.locator('[data-testid="stButtonGroup"]').filter(has_text="vision").get_by_text("vision", exact=True).click()
        pg.wait_for_function(f"[...document.querySelectorAll('.gtitle')].some(g => ({TITLE_TEXT})(g).includes("
                             "'density per layer × module (vision tower)'))", timeout=120_000)
        _settle(pg)
        heat = _chart(pg, "density per layer × module (vision tower)")
        ticks = set(_texts(heat.locator(".ytick text")))
        assert {"qkv", "projector"} <= ticks and "lm_head" not in ticks, ticks  # the vision blocks' fused qkv
        assert pg.locator('[data-testid="stException"]').count() == 0
        if width == 1400:
            _shoot(pg, f"heterogeneity-vl-vision-{scheme}-{width}", width)
        ctx.close()


def _long_named(families, family: str, n: int, root: Path, **sizes) -> tuple[Path, list[Path]]:
    """Copies of a family's base and `n` agents in folders named like the paper's agents (labels = folder names)."""
    import shutil

    from tests.chart_cases import LONG_NAMES

    base = shutil.copytree(families.base(family, **sizes), root / "Qwen2.5-7B-Instruct")
    agents = [shutil.copytree(families.agent(family, i + 1, **sizes), root / name)
              for i, name in enumerate(LONG_NAMES[:n])]
    return base, agents


@pytest.mark.parametrize("n", [2, 3, 8])
def test_structure_charts_stay_readable_with_long_names(browser, families, tmp_path, n):
    """The towers and experts charts with the paper's long names and 2–8 agents: nothing overlaps or is cut."""
    from analysis import experts
    from analysis.stats import analyze
    from app import charts
    from tests.browser.layout_checks import chart_problems, render
    from tests.chart_cases import EPS

    moe = analyze(*_long_named(families, "qwen3_moe", n, tmp_path / "moe", **MOE), use_cache=False)
    vl = analyze(*_long_named(families, "qwen2_5_vl", n, tmp_path / "vl", **VL), use_cache=False)
    half = 0.5 if n <= charts.WRAP_UP_TO else 1.0
    td = experts.tower_density(vl, EPS)
    cases = {"density_per_tower": (charts.tower_bars(td, vl.agents), "Density per tower", half),
             "unique_share_per_tower": (charts.tower_bars(td, vl.agents, "unique_share"), "Unique share per tower",
                                        half),
             "density_layer_expert": (charts.expert_heatmaps(experts.expert_density(moe, EPS), moe.agents),
                                      "Density per layer × expert", 1.0),
             "experts_changed_by": (charts.expert_owner_map(experts.expert_owners(moe, EPS), moe.agents),
                                    "Which agents changed each expert", 1.0)}
    sub = charts.subtitle_of({"eps": EPS, "agents": list(moe.agents)})
    for scheme in ("light", "dark"):
        figures = {name: (charts.styled(fig, title, sub, kind=scheme, px=charts.PAGE_WIDTH), 1.0)  # 1000 px window
                   for name, (fig, title, _width) in cases.items()}
        boxes = render(browser, figures, ARTIFACTS / f"structure-charts-{n}-agents-{scheme}.html", scheme)
        assert len(boxes) == len(figures)
        problems = {m["id"]: chart_problems(m) for m in boxes}
        assert not {k: v for k, v in problems.items() if v}, problems

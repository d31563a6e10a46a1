"""In a real browser: every chart builder, with 2, 3 and 8 agents named like the paper's, drawn by
plotly.js in headless chromium at the width the app gives it in the narrowest supported window (every width, with
the tables, in tests/browser/test_chart_layout.py); the rendered boxes are measured: the title and
subtitle fit the chart's width, the legend overlaps no title, subplot title, plot area or tick label, subplot
titles and annotations do not overlap each other, tick labels do not overlap each other or a neighbouring panel,
and the plot keeps most of the chart's height. Pages (and a screenshot of each) go to test-artifacts/charts-*."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.chart_cases import cases, long_named_result, subtitle
from tests.paths import REPO_ROOT

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
ARTIFACTS = REPO_ROOT / "test-artifacts"
sync_api = pytest.importorskip("playwright.sync_api")
REQUIRED = bool(os.environ.get("RAM_STUDIO_REQUIRE_BROWSER"))
pytestmark = [pytest.mark.skipif(not Path(CHROMIUM).exists() and not REQUIRED, reason="system chromium not installed"),
              pytest.mark.timeout(300)]

# Boxes of every drawn chart, in page pixels (getBoundingClientRect of plotly's SVG groups).
MEASURE = r"""() => [...document.querySelectorAll('.js-plotly-plot')].map(div => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const all = sel => [...div.querySelectorAll(sel)].filter(e => e.getBoundingClientRect().width > 0);
  return {id: div.id, svg: box(div.querySelector('.main-svg')),
          title: all('.g-gtitle').map(box), legend: all('.legend').map(box),
          axistitles: all('.infolayer g[class^="g-x"], .infolayer g[class^="g-y"]').map(box),
          annotations: all('.annotation').map(box), plots: all('.nsewdrag').map(box),
          colorbars: all('.colorbar').map(box),
          ticks: all('.xaxislayer-above').map(g => [...g.querySelectorAll('.xtick text')].map(box)),
          tilted: all('.xaxislayer-above').map(g => [...g.querySelectorAll('.xtick text')].some(
            t => /rotate\((-?[1-9])/.test(t.getAttribute('transform') || ''))),
          yticks: all('.yaxislayer-above').map(g => [...g.querySelectorAll('.ytick text')].map(box))};
})"""


def overlap(a, b, slack: float = 1.0) -> bool:
    return a[0] < b[2] - slack and b[0] < a[2] - slack and a[1] < b[3] - slack and b[1] < a[3] - slack


def check(m: dict) -> list[str]:
    """What is wrong with one rendered chart (empty when it is readable)."""
    bad = []
    svg = m["svg"]
    for t in m["title"]:
        if t[0] < svg[0] - 1 or t[2] > svg[2] + 1:
            bad.append(f"title cut: {t} outside {svg}")
    for lg in m["legend"]:
        if lg[2] > svg[2] + 1 or lg[0] < svg[0] - 1:
            bad.append("legend outside the chart")
        for what in ("title", "annotations", "plots", "colorbars", "axistitles"):
            bad += [f"legend over {what}" for b in m[what] if overlap(lg, b)]
        bad += ["legend over a tick label" for g in m["ticks"] + m["yticks"] for b in g if overlap(lg, b)]
    for t in m["title"]:
        bad += [f"title over {what}" for what in ("annotations", "plots", "axistitles") for b in m[what] if overlap(t,
                                                                                                                    b)]
    for a in m["axistitles"]:  # an axis title stays clear of the other axis's tick labels
        bad += ["axis title over a tick label" for g in m["ticks"] + m["yticks"] for b in g if overlap(a, b, slack=2)]
        bad += ["title over a tick label" for g in m["ticks"] + m["yticks"] for b in g if overlap(t, b)]
    ann = m["annotations"]
    bad += [f"annotations {i} and {j} overlap" for i in range(len(ann)) for j in range(i + 1, len(ann))
            if overlap(ann[i], ann[j])]
    bad += ["annotation outside the chart" for a in ann if a[0] < svg[0] - 1 or a[2] > svg[2] + 1]
    for g, tilted in zip(m["ticks"], m["tilted"]):
        if tilted:  # parallel tilted lines, each ending at its tick: their boxes overlap, the text does not while
            # their ends are a line apart (their left edges are not: a longer label reaches further left)
            bad += [f"tilted tick labels too close: {g[i]} {g[i + 1]}" for i in range(len(g) - 1)
                    if abs(g[i + 1][2] - g[i][2]) < 17]
        else:
            bad += [f"tick labels overlap: {g[i]} {g[i + 1]}" for i in range(len(g) - 1) if overlap(g[i], g[i + 1])]
        for b in g:  # a tick label never spills into another panel
            bad += ["tick label inside a plot" for p in m["plots"] if overlap(b, p, slack=2)]
    height = svg[3] - svg[1] - (max(t[3] for t in m["title"]) - svg[1] if m["title"] else 0)
    for p in m["plots"]:
        if p[3] - p[1] < 0.45 * height:
            bad.append(f"plot area squeezed: {p[3] - p[1]:.0f} of {height:.0f} px")
    return bad


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def render(browser, figures: dict, path: Path, scheme: str = "light") -> list[dict]:
    """One page holding every figure at its app width; returns the measured boxes."""
    import plotly

    from app import charts

    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    divs = []
    for name, (fig, width) in figures.items():
        spec = json.dumps(fig.to_plotly_json(), cls=plotly.utils.PlotlyJSONEncoder)
        px = int(charts.PAGE_WIDTH * width)
        divs.append(f'<div id="{name}" style="width:{px}px;height:{int(fig.layout.height)}px;margin:8px"></div>'
                    f'<script>var s={spec};Plotly.newPlot("{name}",s.data,s.layout,{{staticPlot:true}});</script>')
    bg = "#0E1117" if scheme == "dark" else "#FFFFFF"
    path.write_text(f'<html><body style="background:{bg};font-family:Arial"><script src="{js.as_uri()}"></script>'
                    + "".join(divs) + "</body></html>")
    page = browser.new_page(viewport={"width": charts.PAGE_WIDTH + 40, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_function(f"document.querySelectorAll('.main-svg').length >= {len(figures)}")
    page.wait_for_timeout(300)
    boxes = page.evaluate(MEASURE)
    page.screenshot(path=str(path.with_suffix(".png")), full_page=True)
    page.close()
    return boxes


@pytest.mark.parametrize("n", [2, 3, 8])
def test_every_chart_stays_readable_with_long_names(browser, tmp_path, n):
    """The paper's names (and 2–8 agents) in every chart: nothing overlaps, nothing is cut."""
    from app import charts

    res = long_named_result(tmp_path / "models", n)
    ARTIFACTS.mkdir(exist_ok=True)
    for scheme in ("light", "dark"):
        # at the narrowest supported window every chart takes the page's width (a pair of charts stacks)
        figures = {name: (charts.styled(fig, title, subtitle(res), kind=scheme, px=charts.PAGE_WIDTH), 1.0)
                   for name, (fig, title, _width) in cases(res).items()}
        boxes = render(browser, figures, ARTIFACTS / f"charts-{n}-agents-{scheme}.html", scheme)
        assert len(boxes) == len(figures)
        problems = {m["id"]: check(m) for m in boxes}
        assert not {k: v for k, v in problems.items() if v}, problems

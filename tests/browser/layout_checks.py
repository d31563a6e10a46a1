"""What a reader would call unreadable, measured in a real browser on a Streamlit page: for every plotly chart,
any two texts that overlap (title, legend, axis titles, tick labels, annotations and subplot titles, value labels
on bars, markers and cells, colour bars), the legend over the plot, a text cut by the chart's edge, a legend that
scrolls, a text under MIN_FONT px; for every table, a column that runs past the visible edge without a visible
scroll bar or a cell whose text is cut; and any text Streamlit shortens with an ellipsis (a button "C…", a select box
"custom (the controls bel"); the plot keeps most of the chart's height. Used by the layout tests of tests/browser/,
on Streamlit pages or on figures drawn by plotly.js alone (`render`)."""
from __future__ import annotations

import json
from pathlib import Path

MIN_FONT = 10

CHARTS = """() => [...document.querySelectorAll('.js-plotly-plot')].map((div, index) => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const shown = e => { const r = e.getBoundingClientRect(); const s = getComputedStyle(e);
    return r.width > 0 && r.height > 0 && s.display !== 'none' && s.visibility !== 'hidden' && s.opacity !== '0'
      && e.textContent.trim() !== ''; };
  const texts = sel => [...div.querySelectorAll(sel)].filter(shown).map(e => ({b: box(e), t: e.textContent.trim()}));
  const chart = div.closest('[data-testid="stPlotlyChart"]');
  const holder = chart ? chart.parentElement.closest('[class*="st-key-"]') : null;
  const fonts = [...div.querySelectorAll('text, tspan')].filter(shown)
    .map(e => ({t: e.textContent.trim().slice(0, 40), px: parseFloat(getComputedStyle(e).fontSize)}));
  const scroll = [...div.querySelectorAll('.legend .scrollbar')].filter(e => {
    const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; }).length;
  const axes = g => [...div.querySelectorAll(g)].map(layer => ({
    tilted: [...layer.querySelectorAll('text')].some(t => /rotate\\((-?[1-9])/.test(t.getAttribute('transform') || '')),
    labels: [...layer.querySelectorAll('text')].filter(shown).map(e => ({b: box(e), t: e.textContent.trim()}))}));
  return {index,
    id: chart ? (chart.closest('[class*="st-key-chart_"]') || chart).className.match(/st-key-chart_(\\S+)/)?.[1]
      || String(index) : div.id,
    svg: box(div.querySelector('.main-svg')), title: texts('.g-gtitle text'),
    legend: [...div.querySelectorAll('.legend')].filter(e => e.getBoundingClientRect().width > 0).map(box),
    legendtexts: texts('.legend .legendtext'), scroll,
    axistitles: texts('.infolayer g[class^="g-x"] text, .infolayer g[class^="g-y"] text'),
    annotations: texts('.annotation-text-g text'), colorbars: texts('.colorbar text'),
    datatexts: texts('.cartesianlayer .plot text, .heatmaplayer text'),
    plots: [...div.querySelectorAll('.nsewdrag')].filter(e => e.getBoundingClientRect().width > 0).map(box),
    xaxes: axes('.xaxislayer-above'), yaxes: axes('.yaxislayer-above'), fonts};
})"""

TABLES = """() => {
  const visibleBar = s => { const c = getComputedStyle(s).scrollbarColor || '';
    const thumb = c.split(/\\)\\s+/)[0];
    return !/rgba\\([^)]*,\\s*0\\)?$/.test(thumb) && c !== 'transparent transparent'; };
  const out = [];
  document.querySelectorAll('[data-testid="stDataFrame"], [data-testid="stTable"]').forEach((t, i) => {
    const grid = t.getAttribute('data-testid') === 'stDataFrame';
    const s = grid ? t.querySelector('.dvn-scroller') : t.querySelector(':scope > div');
    if (!s) return;
    const label = (t.innerText || '').split('\\n')[0].slice(0, 40);
    const overflow = s.scrollWidth > s.clientWidth + 1;
    const bar = s.offsetHeight - s.clientHeight;
    const cut = grid ? [] : [...t.querySelectorAll('th, td')].filter(c => c.scrollWidth > c.clientWidth + 1)
      .map(c => c.textContent.trim().slice(0, 30));
    out.push({i, grid, label, overflow, bar, visible: visibleBar(s), cut,
              width: t.getBoundingClientRect().width, inner: s.scrollWidth});
  });
  return out;
}"""

ELLIPSES = """() => [...document.querySelectorAll('[data-testid="stMain"] *, [data-testid="stSidebar"] *')]
  .filter(e => {
  if (!e.textContent.trim() || e.children.length > 2) return false;
  const s = getComputedStyle(e);
  return s.textOverflow === 'ellipsis' && s.overflow !== 'visible' && e.scrollWidth > e.clientWidth + 1
    && e.getBoundingClientRect().width > 0;
}).map(e => e.textContent.trim().slice(0, 60))"""


def overlap(a, b, slack: float = 1.0) -> bool:
    return a[0] < b[2] - slack and b[0] < a[2] - slack and a[1] < b[3] - slack and b[1] < a[3] - slack


def _outside(b, svg, slack: float = 1.0) -> bool:
    return b[0] < svg[0] - slack or b[2] > svg[2] + slack or b[1] < svg[1] - slack or b[3] > svg[3] + slack


def _pairs(name_a: str, a: list[dict], name_b: str, b: list[dict], slack: float = 1.0) -> list[str]:
    return [f"{name_a} '{x['t']}' over {name_b} '{y['t']}'" for x in a for y in b if x is not y
            and overlap(x["b"], y["b"], slack)]


def chart_problems(m: dict) -> list[str]:
    """What is unreadable in one rendered chart (empty when nothing is)."""
    bad: list[str] = []
    svg = m["svg"]
    ticks = [t for ax in m["xaxes"] + m["yaxes"] for t in ax["labels"]]
    xticks = [t for ax in m["xaxes"] for t in ax["labels"]]
    yticks = [t for ax in m["yaxes"] for t in ax["labels"]]
    named = {"title": m["title"], "axis title": m["axistitles"], "annotation": m["annotations"],
             "legend entry": m["legendtexts"], "value label": m["datatexts"], "colour bar": m["colorbars"]}
    for what, items in {**named, "tick label": ticks}.items():
        bad += [f"{what} cut by the chart's edge: '{t['t']}'" for t in items if _outside(t["b"], svg)]
    bad += [f"text under {MIN_FONT} px: '{f['t']}' ({f['px']:g} px)" for f in m["fonts"] if f["px"] < MIN_FONT - 0.01]
    if m["scroll"]:
        bad.append("the legend scrolls: some entries are hidden")
    for lg in m["legend"]:
        bad += ["legend over the plot area" for p in m["plots"] if overlap(lg, p)]
        bad += [f"legend over {what} '{t['t']}'" for what in ("title", "axis title", "annotation", "value label",
                                                             "colour bar") for t in named[what] if overlap(lg, t["b"])]
        bad += [f"legend over tick label '{t['t']}'" for t in ticks if overlap(lg, t["b"])]
    keys = list(named)
    for i, a in enumerate(keys):  # every other pair of kinds, and within a kind
        for b in keys[i:]:
            if {a, b} == {"legend entry"}:
                continue
            bad += _pairs(a, named[a], b, named[b])
        bad += _pairs(a, named[a], "tick label", ticks, slack=2)
    bad += _pairs("x tick label", xticks, "y tick label", yticks, slack=1)
    for ax in m["xaxes"]:
        g = ax["labels"]
        # parallel tilted lines (each ends at its tick): boxes overlap, texts do not while a line apart
        if ax["tilted"]:
            bad += [f"tilted tick labels too close: '{g[i]['t']}' '{g[i + 1]['t']}'" for i in range(len(g) - 1)
                    if abs(g[i + 1]["b"][2] - g[i]["b"][2]) < 17]
        else:
            bad += [f"tick labels overlap: '{g[i]['t']}' '{g[i + 1]['t']}'" for i in range(len(g) - 1)
                    if overlap(g[i]["b"], g[i + 1]["b"])]
    for ax in m["yaxes"]:
        g = ax["labels"]
        bad += [f"tick labels overlap: '{g[i]['t']}' '{g[i + 1]['t']}'" for i in range(len(g) - 1)
                if overlap(g[i]["b"], g[i + 1]["b"])]
    for t in ticks + m["title"]:  # a tick label or the title never spills into a panel
        bad += [f"'{t['t']}' inside a plot" for p in m["plots"] if overlap(t["b"], p, slack=2)]
    # the plot keeps most of the height the title and a legend above the plots leave: a single plot 45 %, panels
    # their share of 30 %
    above = [t["b"][3] for t in m["title"]] + [lg[3] for lg in m["legend"] if m["plots"] and
                                              lg[3] <= min(p[1] for p in m["plots"]) + 1]
    height = svg[3] - max([svg[1], *above])
    least = 0.45 * height if len(m["plots"]) == 1 else 0.3 * height / max(1, len(m["plots"]))
    bad += [f"plot area squeezed: {p[3] - p[1]:.0f} of {height:.0f} px" for p in m["plots"] if p[3] - p[1] < least]
    return sorted(set(bad))


def table_problems(t: dict) -> list[str]:
    """A table wider than its frame with no visible scroll bar, or (an HTML table) a cell whose text is cut."""
    bad = []
    if t["overflow"] and not (t["bar"] >= 6 and t["visible"]):
        bad.append(f"table '{t['label']}': {t['inner'] - t['width']:.0f} px of columns hidden past the edge, no "
                   "visible scroll bar")
    bad += [f"table '{t['label']}': cell cut '{c}'" for c in t["cut"]]
    return bad


def page_problems(page) -> dict[str, list[str]]:
    """Every problem on the page, by chart id (and 'tables', 'ellipses')."""
    out = {m["id"]: chart_problems(m) for m in page.evaluate(CHARTS)}
    out["tables"] = [p for t in page.evaluate(TABLES) for p in table_problems(t)]
    out["ellipses"] = [f"text shortened with an ellipsis: '{t}'" for t in page.evaluate(ELLIPSES)]
    return {k: v for k, v in out.items() if v}


def render(browser, figures: dict, path: Path, scheme: str = "light") -> list[dict]:
    """Figures drawn by plotly.js alone (no Streamlit), each `width` × the app's PAGE_WIDTH wide, on one page
    written to `path` (with a screenshot beside it); the measurements `chart_problems` reads, one per figure."""
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
    try:
        page.goto(path.as_uri())
        page.wait_for_function(f"document.querySelectorAll('.main-svg').length >= {len(figures)}")
        page.wait_for_timeout(300)
        boxes = page.evaluate(CHARTS)
        page.screenshot(path=str(path.with_suffix(".png")), full_page=True)
    finally:
        page.close()
    return boxes

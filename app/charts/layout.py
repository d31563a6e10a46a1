"""The one layout rule: a chart laid out from the width it is drawn at. Every figure the app shows goes through
`fit` (called by `styled`): panels side by side or stacked, the legend beside the plot or above it, category tick
labels level, on two lines or tilted, bar and cell labels at a readable size (at least MIN_FONT px) or left to the
hover, margins to match. Builders stay pure (frames in, figures out); they only say, through `panels`, how
narrow a panel of theirs may get."""
from __future__ import annotations

import html
import math
import re

import plotly.graph_objects as go

MIN_FONT = 10  # px: no text the app draws is smaller
LABEL_FONT = 11  # px: bar and cell value labels
MIN_PLOT_PX = 300  # the plot area a chart keeps beside a legend on its right
GAP_PX = 16  # Streamlit's gap between two columns ("small")
PAIR_PX = 420  # the narrowest chart that stands beside another (else charts of a pair stack)
MARGIN_PX = 80  # left margin (y ticks and title) + right padding of a plot, roughly
PANEL_KEY = "panel_px"

# Widths of the characters of a 1 px Arial-like font (Source Sans Pro is narrower): generous, so an estimate never
# comes out short.
_NARROW, _WIDE = set("ilIjtf.,:;'|!()[]{} 1r"), set("mwMW@%—…")


def char_px(c: str, size: float) -> float:
    """The width of one character at `size` px (an upper estimate)."""
    if c in _NARROW:
        return 0.36 * size
    if c in _WIDE:
        return 0.92 * size
    if c.isupper() or c.isdigit():
        return 0.64 * size
    return 0.56 * size


def plain_lines(text: object) -> list[str]:
    """The lines a plotly label shows: split at <br>, tags dropped, entities turned back into characters."""
    return [html.unescape(re.sub(r"<[^>]+>", "", part)) for part in re.split(r"<br\s*/?>", str(text or ""))]


def text_px(text: object, size: float = 13) -> float:
    """The width of a plotly label's widest line at `size` px."""
    return max((sum(char_px(c, size) for c in line) for line in plain_lines(text)), default=0.0)


def n_lines(text: object) -> int:
    return len(plain_lines(text)) if text else 0


def panels(fig: go.Figure, min_px: int) -> go.Figure:
    """Mark a one-row grid of subplots: each panel needs at least `min_px` px of width, else the rule puts them
    on more rows."""
    meta = dict(fig.layout.meta or {}) if isinstance(fig.layout.meta, dict) else {}
    fig.update_layout(meta={**meta, PANEL_KEY: int(min_px)})
    return fig


def side_by_side(width: float, n: int = 2, min_px: int = PAIR_PX) -> bool:
    """Whether `n` charts fit side by side in a column `width` px wide, each at least `min_px` px."""
    return (width - GAP_PX * (n - 1)) / n >= min_px


# ---------------------------------------------------------------- the axes of a figure

def _axes(fig: go.Figure, letter: str) -> list[str]:
    """Layout keys of the figure's x (or y) axes, in order: xaxis, xaxis2, …"""
    keys = [k for k in fig.layout if re.fullmatch(fr"{letter}axis\d*", k)]
    return sorted(keys or [f"{letter}axis"], key=lambda k: int(k[5:] or 1))


def _ref(key: str) -> str:
    """'xaxis2' → 'x2' (how traces name their axes)."""
    return key[0] + key[5:]


def _domain(fig: go.Figure, key: str) -> tuple[float, float]:
    d = fig.layout[key].domain
    return (float(d[0]), float(d[1])) if d else (0.0, 1.0)


def _traces_on(fig: go.Figure, xkey: str) -> list:
    ref = _ref(xkey)
    return [t for t in fig.data if (getattr(t, "xaxis", None) or "x") == ref]


def _categories(fig: go.Figure, xkey: str) -> list[str]:
    """The categories of a category x axis, in order of appearance ([] for a numeric axis)."""
    ax = fig.layout[xkey]
    if ax.type not in (None, "category", "-"):
        return []
    seen: dict[str, None] = {}
    for t in _traces_on(fig, xkey):
        if t.type in ("bar", "scatter", "heatmap", "box") and getattr(t, "orientation", None) != "h":
            for v in t.x if t.x is not None else []:
                if v is None or not isinstance(v, str):
                    if ax.type != "category":
                        return []
                    continue
                seen[v] = None
    if ax.categoryarray is not None and ax.categoryorder == "array":
        return [str(c) for c in ax.categoryarray]
    return list(seen)


# ---------------------------------------------------------------- panels: one row, or several

def _single_row(fig: go.Figure) -> list[tuple[str, str]]:
    """(x key, y key) of each panel when the figure is one row of two or more panels, else []."""
    xs = _axes(fig, "x")
    if len(xs) < 2:
        return []
    pairs = []
    for xk in xs:
        anchor = fig.layout[xk].anchor or "y"
        yk = "yaxis" + anchor[1:]
        if yk not in fig.layout or _domain(fig, yk) != _domain(fig, "yaxis"):
            return []
        pairs.append((xk, yk))
    lefts = [_domain(fig, xk)[0] for xk, _ in pairs]
    return pairs if lefts == sorted(lefts) else []


def _y_labelled(fig: go.Figure, yk: str) -> bool:
    ax = fig.layout[yk]
    return ax.showticklabels is not False and not ax.matches


def arrange(fig: go.Figure, width: float) -> int:
    """A one-row grid of panels laid out in as many columns as fit `width` (each at least its builder's panel
    width), the rest on further rows; the gaps sized in px for the labels between panels. Returns the height
    added (px)."""
    grid = _single_row(fig)
    if not grid:
        return 0
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    min_px = int(meta.get(PANEL_KEY, 240))
    k = len(grid)
    labelled = any(_y_labelled(fig, yk) for _, yk in grid[1:])
    ytitle = max((n_lines(fig.layout[yk].title.text) for _, yk in grid), default=0)
    gap = (58 + 20 * ytitle) if labelled else 14
    plot = max(width - MARGIN_PX - _right_px(fig), 120)
    cols = max(1, min(k, int((plot + gap) // (min_px + gap))))
    rows = math.ceil(k / cols)
    w = (1 - gap / plot * (cols - 1)) / cols
    ticks = [tick_plan(list(fig.layout[xk].ticktext or cats), plot * w / len(cats))[2]
             for xk, _ in grid for cats in [_named(fig, xk)] if cats]
    titles = [a for a in fig.layout.annotations if a.name == "subplot-title"]
    row_gap = max(ticks, default=24) + 24 + 18 * max((n_lines(a.text) for a in titles), default=0) + 28
    height = int(fig.layout.height or 360)
    # fit() adds the labels' height beyond two lines to the figure, so the plot area stays this high:
    top, bottom = _top_band(fig), 70
    row_px = max(150, height - top - bottom)
    new_height = height + (rows - 1) * (row_px + row_gap)
    area = new_height - top - bottom
    gx = gap / plot
    for i, (xk, yk) in enumerate(grid):
        r, c = divmod(i, cols)
        x0 = c * (w + gx)
        y1 = 1 - r * (row_px + row_gap) / area
        y0 = max(0.0, y1 - row_px / area)
        fig.layout[xk].domain = [x0, x0 + w]
        fig.layout[yk].domain = [y0, y1]
        if c == 0 and fig.layout[yk].matches:  # first of its row: its own tick labels and title
            fig.layout[yk].showticklabels = True
        if i < len(titles):
            titles[i].update(x=x0 + w / 2, y=y1, xanchor="center", yanchor="bottom")
        for t in _traces_on(fig, xk):  # a panel's own colour bar stands beside it
            if t.type == "heatmap" and t.showscale is not False and not t.coloraxis:
                t.colorbar.update(x=x0 + w + 0.01, xanchor="left", y=y1, yanchor="top", len=y1 - y0,
                                  lenmode="fraction")
    if rows > 1:
        title = next((fig.layout[yk].title.text for _, yk in grid if fig.layout[yk].title.text), None)
        for i, (_, yk) in enumerate(grid):
            if i % cols == 0 and title and not fig.layout[yk].title.text:
                fig.layout[yk].title.text = title
    fig.layout.height = new_height
    return new_height - height


def _top_band(fig: go.Figure) -> int:
    """The room a builder keeps above the plot (for subplot titles)."""
    return int(fig.layout.margin.t if fig.layout.margin.t is not None else 10)


def _right_px(fig: go.Figure) -> float:
    """Room the plot gives up on its right: a colour bar's."""
    has_bar = any(getattr(t, "showscale", None) and t.type == "heatmap" for t in fig.data) or (
        fig.layout.coloraxis.colorbar is not None and any(getattr(t, "coloraxis", None) for t in fig.data))
    return 90.0 if has_bar else 10.0


# ---------------------------------------------------------------- the legend: beside the plot, or above it

LEGEND_LINE_PX = 20  # one line of a legend entry (13 px text)
LEGEND_SYMBOL_PX = 48  # the entry's symbol and the gaps around it


def _entries(fig: go.Figure) -> list[str]:
    if fig.layout.showlegend is False:
        return []
    return [t.name for t in fig.data if t.showlegend is not False and t.name]


def place_legend(fig: go.Figure, width: float) -> tuple[str, int]:
    """Beside the plot (top-aligned, on its right) when the plot keeps most of the width and the legend fits its
    height; else above the plot, in rows under the title. Returns where ('right', 'top' or '') and the height
    (px) a legend above the plot needs."""
    names = _entries(fig)
    if not names:
        return "", 0
    legend_w = LEGEND_SYMBOL_PX + max(text_px(n) for n in names)
    legend_h = sum(LEGEND_LINE_PX * n_lines(n) for n in names) + 10
    plot_h = int(fig.layout.height or 360) - _top_band(fig) - 60
    plot_w = width - MARGIN_PX - legend_w
    grid = _single_row(fig)
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    need = (len(grid) * int(meta.get(PANEL_KEY, 240)) + 80 * (len(grid) - 1)) if grid else max(MIN_PLOT_PX,
                                                                                                0.6 * width)
    if plot_w >= need and legend_h <= plot_h:
        fig.update_layout(legend=dict(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top", yref="paper"))
        return "right", 0
    for t in fig.data:  # one line per entry: rows of equal cells
        if t.name and "<br>" in t.name:
            t.name = t.name.replace("<br>", " ")
    cell = max(text_px(n) for n in _entries(fig)) + 6
    per_row = max(1, int((width - MARGIN_PX - 10) // (cell + LEGEND_SYMBOL_PX)))  # rows as wide as the plot
    rows = math.ceil(len(names) / per_row)
    fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", yref="container", yanchor="top",
                                  entrywidth=cell, entrywidthmode="pixels", maxheight=rows * LEGEND_LINE_PX + 24))
    return "top", rows * LEGEND_LINE_PX + 12


# ---------------------------------------------------------------- tick labels, bar labels, cell labels

def _plot_px(fig: go.Figure, width: float, legend: str) -> float:
    legend_w = LEGEND_SYMBOL_PX + max((text_px(n) for n in _entries(fig)), default=0) if legend == "right" else 0
    return max(width - MARGIN_PX - max(legend_w, _right_px(fig)), 60.0)


def _joined(text: str) -> str:
    return re.sub(r"<br\s*/?>", "", text)


def _two_lines(text: str) -> str:
    """An (escaped) label broken after the separator nearest its middle; unchanged when it has none."""
    cuts = [i + 1 for i, ch in enumerate(text) if ch in "-_ ./…" and 0 < i < len(text) - 1 and ch != "&"]
    if " " in text.strip():  # words: break between words only, never inside a number such as 1e-5
        cuts = [i + 1 for i, ch in enumerate(text) if ch == " " and 0 < i < len(text) - 1]
    if not cuts:
        return text
    cut = min(cuts, key=lambda i: abs(i - len(text) / 2))
    return text[:cut].rstrip() + "<br>" + text[cut:].lstrip()


def _named(fig: go.Figure, xk: str) -> list[str]:
    """The categories of an x axis whose labels the rule lays out: names (agents, methods, tasks, models), not
    the numbered layers and experts of heatmaps, which plotly thins itself."""
    cats = _categories(fig, xk)
    numbered = sum(bool(re.fullmatch(r"-?\d+|emb/head", c)) for c in cats)
    return [] if not cats or numbered >= len(cats) / 2 else cats


def tick_plan(texts: list[str], slot: float) -> tuple[list[str], int, float]:
    """Labels for category slots `slot` px wide: level on one line when they fit, else level on two lines, else
    one line tilted 45° (90° when the slots are too close even for that); and the height (px) they take."""
    one = [_joined(t) for t in texts]
    two = [_two_lines(t) for t in one]
    widest = max(text_px(t) for t in one)
    if widest <= slot - 8:
        return one, 0, 18.0
    if max(text_px(t) for t in two) <= slot - 8:
        return two, 0, 36.0
    if slot >= 20:
        return one, -45, 0.72 * widest + 16
    return one, -90, widest + 8


def fit_ticks(fig: go.Figure, width: float, legend: str) -> float:
    """Each named category x axis laid out by `tick_plan` for the slot its categories get; returns the height
    (px) the tallest labels need beyond two level lines (the figure grows by it, so the plot keeps its height)."""
    plot = _plot_px(fig, width, legend)
    extra = 0.0
    for xk in _axes(fig, "x"):
        cats = _named(fig, xk)
        if not cats:
            continue
        lo, hi = _domain(fig, xk)
        texts = list(fig.layout[xk].ticktext) if fig.layout[xk].ticktext else cats
        chosen, angle, tall = tick_plan(texts, plot * (hi - lo) / len(cats))
        fig.layout[xk].update(tickmode="array", tickvals=cats, ticktext=chosen, tickangle=angle)
        extra = max(extra, tall - 36)
    return extra


def _bars_per_slot(fig: go.Figure, xk: str) -> int:
    bars = [t for t in _traces_on(fig, xk) if t.type == "bar" and t.visible is not False]
    if fig.layout.barmode in ("stack", "relative", "overlay"):
        return 1
    groups = {t.offsetgroup for t in bars if t.offsetgroup}
    return max(1, len(groups) if groups else len(bars))


def _text_options(trace) -> list[list[str]]:
    meta = trace.meta if isinstance(trace.meta, dict) else {}
    return [list(o) for o in meta.get("texts", [])] or [list(trace.text)]


def fit_texts(fig: go.Figure, width: float, legend: str) -> None:
    """Value labels on bars, text-only markers and heatmap cells: the first of a trace's texts (its own, or the
    shorter ones it offers in `meta["texts"]`) that fits its slot at LABEL_FONT or MIN_FONT px; none left when
    none fits (the hover keeps the values)."""
    plot = _plot_px(fig, width, legend)
    fig.update_layout(uniformtext=dict(minsize=MIN_FONT, mode="hide"))
    for xk in _axes(fig, "x"):
        cats = _categories(fig, xk)
        lo, hi = _domain(fig, xk)
        span = plot * (hi - lo)
        for t in _traces_on(fig, xk):
            if t.type == "heatmap" and t.texttemplate:
                cell = span / max(1, len(t.x) if t.x is not None else len(t.z[0]))
                size = next((s for s in (LABEL_FONT + 1, MIN_FONT) if max(
                    (text_px(v, s) for row in t.text for v in row), default=0) <= cell - 4), None)
                t.update(textfont=dict(size=size)) if size else t.update(texttemplate="")
                continue
            has_text = t.text is not None and not isinstance(t.text, str) and len(t.text)
            if not has_text or not cats or t.type not in ("bar", "scatter"):
                continue
            if t.type == "scatter" and "text" not in (t.mode or ""):
                continue
            inside = t.type == "bar" and t.textposition == "inside"
            if inside:  # stacked segments: plotly fits the text to the segment; uniformtext hides a tiny one
                t.update(textfont=dict(size=LABEL_FONT), insidetextanchor=t.insidetextanchor or "middle")
                continue
            slot = span / len(cats) / (_bars_per_slot(fig, xk) if t.type == "bar" else 1)
            pick = None
            for option in _text_options(t):
                size = next((s for s in (LABEL_FONT, MIN_FONT) if max(
                    (text_px(v, s) for v in option), default=0) <= slot - 3), None)
                if size:
                    pick = (option, size)
                    break
            if pick is None:
                t.update(text=None, texttemplate=None)
            else:
                t.update(text=pick[0], textfont=dict(size=pick[1]), constraintext="none")


def fit(fig: go.Figure, width: float, band: int) -> go.Figure:
    """The rule, on a built figure drawn `width` px wide under a title band `band` px high: panels arranged,
    legend placed, ticks and value labels fitted, the top margin and height to hold them all."""
    where, legend_h = place_legend(fig, width)
    arrange(fig, width - (LEGEND_SYMBOL_PX + max(text_px(n) for n in _entries(fig)) if where == "right" else 0))
    extra = fit_ticks(fig, width, where)
    fit_texts(fig, width, where)
    top = _top_band(fig)
    height = int(fig.layout.height or 360) + band + legend_h + int(extra)
    fig.update_layout(height=height, margin=dict(t=top + band + legend_h))
    if where == "top":
        fig.update_layout(legend=dict(y=1 - (band - 4) / height))
    if fig.layout.coloraxis.colorbar.title.text:  # beside the bar: a title on top meets the top tick label
        fig.layout.coloraxis.colorbar.title.side = "right"
    for a in fig.layout.annotations:
        if a.font.size is not None and a.font.size < MIN_FONT:
            a.font.size = MIN_FONT
    return fig

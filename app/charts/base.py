"""Palettes, plotly templates, and the one rule for names, legends, titles, layouts and log axes that every chart
follows."""
from __future__ import annotations

import math
import re

import plotly.graph_objects as go
import plotly.io as pio

from app.markup import plot_text

# Okabe-Ito (colour-blind safe) without its yellow and black, which vanish on white and on dark backgrounds.
AGENT_PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#8C564B", "#7F7F7F"]
# The toy's made-up agents A1…A5 (Paul Tol's muted colours): never mistaken for the real agents above.
TOY_PALETTE = ["#CC6677", "#999933", "#882255", "#44AA99", "#DDCC77"]
# Overlap count k: purple = unique to one agent, greys = shared (darker = more agents); readable on both themes.
OVERLAP_COLORS = ["#7B3294", "#D0D0D0", "#A8A8A8", "#808080", "#5E5E5E", "#404040"]
UNIQUE_COLOR, SHARED_COLOR = OVERLAP_COLORS[0], "#9A9A9A"
UNIQUE_TEXT = "#9B59C5"  # the unique purple, light enough to read on the dark theme too
NEUTRAL = "#8A8A8A"  # curves and reference lines: mid grey, legible on white and on the dark theme
FONT = dict(family="Source Sans Pro, Arial, sans-serif", size=13)
THEMES = {"light": dict(paper="#FFFFFF", ink="#31333F", grid="#E5E5E5", minor="#F2F2F2"),
          "dark": dict(paper="rgba(0,0,0,0)", ink="#FAFAFA", grid="#3A3B40", minor="#26272B")}  # dark: page's own


def _template(kind: str) -> go.layout.Template:
    """A small plotly template per theme (plotly's own are large: applying one costs ~10 ms a figure, and the
    Tune fragment draws several figures per slider move)."""
    t = THEMES[kind]
    axis = dict(gridcolor=t["grid"], zerolinecolor=t["grid"], linecolor=t["grid"], showgrid=True, zeroline=False,
                automargin=True, ticks="", title=dict(standoff=12), minor=dict(gridcolor=t["minor"]))
    return go.layout.Template(layout=dict(
        paper_bgcolor=t["paper"], plot_bgcolor=t["paper"], font=dict(color=t["ink"], **FONT), colorway=AGENT_PALETTE,
        xaxis={**axis, "ticklabelstandoff": 8}, yaxis=axis,  # x labels clear of the lowest y label
        hoverlabel=dict(font=dict(family=FONT["family"])), hovermode="closest",
        coloraxis=dict(colorbar=dict(outlinewidth=0, ticks="")), legend=dict(bgcolor="rgba(0,0,0,0)")))


TEMPLATES = {kind: _template(kind) for kind in THEMES}
pio.templates["ram_light"], pio.templates["ram_dark"] = TEMPLATES["light"], TEMPLATES["dark"]
pio.templates.default = "ram_light"  # every figure starts small and light; `styled` switches to dark when needed
FIG_FORMAT_KEY = "fig_format"  # sidebar choice: what the chart's camera button downloads
FIG_FORMATS = {"PNG (print, 3×)": "png", "SVG": "svg"}
EXPORT_WIDTH, EXPORT_SCALE = 1000, 3  # a downloaded PNG is 3000 px wide: 10 in at 300 dpi


def agent_colors(agents: list[str]) -> dict[str, str]:
    """Colour of each agent, fixed by its name: agents are coloured in alphabetical order of their labels,
    so the same agents listed in any order keep their colours on every page."""
    order = sorted(dict.fromkeys(agents), key=lambda a: (a.lower(), a))
    return {a: AGENT_PALETTE[order.index(a) % len(AGENT_PALETTE)] for a in agents}


def label(name: object) -> str:
    """How a model, agent, task or other data-derived name is written in a figure (axis categories, legend,
    hover text, titles): escaped for plotly (`app.markup.plot_text`), so a name is never markup. Every
    builder below draws names through this (or `labels`)."""
    return plot_text(name)


def labels(names) -> list[str]:
    """`label` of each name, in order."""
    return [label(n) for n in names]


def toy_colors(names: list[str]) -> dict[str, str]:
    """The toy's agents A1…An, by position (they are numbered), from a palette the real agents never use."""
    return {n: TOY_PALETTE[i % len(TOY_PALETTE)] for i, n in enumerate(names)}


# ---------------------------------------------------------------- names, legends, titles: one rule for every chart

def short_labels(names: list[str], width: int = 20) -> dict[str, str]:
    """Axis labels for agent names, at most `width` characters: an `org/` prefix dropped, then the name parts
    every agent shares (e.g. '-7B'), then middle parts replaced by '…' (the first part and as many of the last
    as fit: 'Qwen2.5…grpo-cold'). Distinct names stay distinct; hover texts keep the full names."""
    base = {n: n.rstrip("/").rsplit("/", 1)[-1] or n for n in names}
    split = {n: re.split(r"([-_ ])", b) for n, b in base.items()}  # words at even positions, separators between
    common = set.intersection(*(set(t[::2]) for t in split.values())) if len(names) > 1 else set()
    out = {}
    for n, tokens in split.items():
        words = [(tokens[i - 1] if i else "", tokens[i]) for i in range(0, len(tokens), 2)]
        kept = [(sep, w) for sep, w in words if w not in common]
        if sum(len(w) for _, w in kept) < 6:  # too little left to recognise: keep the shared parts
            kept = words
        kept = [("", kept[0][1]), *kept[1:]]
        text = "".join(sep + w for sep, w in kept)
        if len(text) > width:
            text = _middle_out(kept, width)
        out[n] = text
    if len(set(out.values())) < len(out):  # shortening made two names equal: number them
        out = {n: f"{i + 1}: {v}" for i, (n, v) in enumerate(out.items())}
    return {n: label(v) for n, v in out.items()}  # names are file-derived: escaped for plotly


def _middle_out(parts: list[tuple[str, str]], width: int) -> str:
    """(separator, word) parts shortened to `width`: the first word, '…', and as many whole last words as fit;
    characters cut from the middle when even that does not fit."""
    head = parts[0][1]
    chosen: list[tuple[str, str]] = []
    for part in reversed(parts[1:]):
        trial = [part, *chosen]
        tail = trial[0][1] + "".join(sep + w for sep, w in trial[1:])
        if len(head) + 1 + len(tail) > width:
            break
        chosen = trial
    if chosen and len(head) + 1 < width:
        return head + "…" + chosen[0][1] + "".join(sep + w for sep, w in chosen[1:])
    text = "".join(sep + w for sep, w in parts)
    left = (width - 1) // 2
    return text[:left] + "…" + text[len(text) - (width - 1 - left):]


TICK_LINE = 12  # characters per line of a category tick label (an agent's short name wraps onto two lines)


def tick_label(text: str, line: int = TICK_LINE) -> str:
    """A short label for an axis tick, escaped, broken after the separator nearest its middle when longer than
    `line` (ReasonFlux-<br>Coder): category ticks stay level and narrow instead of tilting."""
    text = str(text)
    if len(text) <= line:
        return label(text)
    cuts = [i + 1 for i, ch in enumerate(text) if ch in "-_ ./…" and 0 < i < len(text) - 1]
    if " " in text.strip():  # words: break between them only, never inside a number such as 1e-5
        cuts = [i + 1 for i, ch in enumerate(text) if ch == " " and 0 < i < len(text) - 1]
    if not cuts:
        return label(text)
    cut = min(cuts, key=lambda i: abs(i - len(text) / 2))
    return label(text[:cut]) + "<br>" + label(text[cut:])


WRAP_UP_TO = 3  # agents whose tick labels stand level on two lines; more take one line each, tilted 45°


def _level(agents: list[str], narrow: bool) -> bool:
    return len(agents) <= WRAP_UP_TO and not narrow


def agent_ticks(agents: list[str], narrow: bool = False) -> list[str]:
    """The agents' tick labels: `short_labels`, on two level lines (`tick_label`) for up to WRAP_UP_TO agents,
    else (or in a `narrow` panel) on one line, tilted by `agent_axis`; full names go in the hover texts."""
    short = short_labels(list(agents))
    return [tick_label(short[a]) if _level(agents, narrow) else label(short[a]) for a in agents]


def agent_axis(fig: go.Figure, agents: list[str], narrow: bool = False, **where) -> None:
    """An x axis of agents, with the angle fixed: level labels for a few, one line tilted 45° for many (plotly's
    own choice would tilt two-line labels, or tilt them 90° and take half the chart's height)."""
    fig.update_xaxes(type="category", tickangle=0 if _level(agents, narrow) else -45, **where)


def agent_names(agents: list[str]) -> dict[str, str]:
    """Each agent's legend entry: its `short_labels` name, escaped."""
    return {a: label(s) for a, s in short_labels(list(agents)).items()}


def wrap(text: str, chars: int) -> list[str]:
    """Plain text broken into lines of at most `chars` characters at spaces (a longer word stays whole)."""
    lines, line = [], ""
    for word in str(text).split(" "):
        if line and len(line) + 1 + len(word) > chars:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line or not lines else lines


LEGEND_LINE = 20  # characters per line of a legend entry
Y_TITLE_LINE = 26  # characters per line of a y axis title (longer ones wrap onto two lines)
LEGEND = dict(orientation="v", yanchor="top", y=1, xanchor="left", x=1.02, title_text="",
              bgcolor="rgba(0,0,0,0)", traceorder="normal")  # beside the plot: never over a title, axis or tick


def chart_layout(fig: go.Figure, height: int = 360, legend: bool = True, **kw) -> go.Figure:
    """Size, font and the one legend rule: a legend stands to the right of the plot, top-aligned (plotly widens
    the right margin for it), so it never covers a title, a subplot title, the data or the tick labels."""
    margin = kw.pop("margin", dict(l=10, r=10, t=10, b=10))
    fig.update_layout(height=height, font=FONT, margin=margin, showlegend=legend, legend=LEGEND, **kw)
    for key in [k for k in fig.layout if k.startswith("yaxis")]:  # a y title never outgrows the plot's height
        text = fig.layout[key].title.text
        if text and "<br>" not in text and len(text) > Y_TITLE_LINE:
            fig.layout[key].title.text = "<br>".join(wrap(text, max(Y_TITLE_LINE, len(text) // 2 + 4)))
    for tr in fig.data:  # a long entry takes two lines, so the legend stays narrow
        if tr.name and "<br>" not in tr.name and len(tr.name) > LEGEND_LINE and " " in tr.name:
            cut = min((i for i, c in enumerate(tr.name) if c == " "), key=lambda i: abs(i - len(tr.name) / 2))
            tr.name = tr.name[:cut] + "<br>" + tr.name[cut + 1:]
    return fig


def room_for_subplot_titles(fig: go.Figure, lines: int = 1) -> None:
    """Room above the plots for subplot titles of `lines` lines (the chart's own title goes above them); the
    titles are named, so the layout rule can move them with their panels."""
    fig.update_layout(margin=dict(t=10 + 18 * lines))
    fig.update_annotations(font=dict(size=13))
    fig.update_annotations(selector=dict(xref="paper", yref="paper"), name="subplot-title")


def eps_label(eps: float) -> str:
    return "0" if eps == 0 else f"{eps:.0e}".replace("e-0", "e-")


def pct(v: float) -> str:
    """A share as a percentage that stays readable when small: 43 %, 4.3 %, 0.43 %, 0.043 %."""
    p = 100 * v
    if p == 0:
        return "0%"
    return f"{p:.0f}%" if p >= 10 else (f"{p:.1f}%" if p >= 1 else f"{p:.2g}%")


def decades(values) -> tuple[int, int]:
    """The whole decades (powers of ten) that cover the positive finite `values`: at least one decade."""
    positive = [v for v in values if v is not None and math.isfinite(v) and v > 0] or [1.0]
    lo, hi = math.floor(math.log10(min(positive))), math.ceil(math.log10(max(positive)))
    return lo, hi + (hi == lo)


def decade_text(k: int) -> str:
    """10^k written as a reader writes it: 0.001, 0.1, 1, 10, 1000, then 1e-5 or 1e4 beyond."""
    return f"{10.0 ** k:g}".replace("e-0", "e-").replace("e+0", "e").replace("e+", "e") if -4 <= k <= 4 \
        else f"1e{k}"


def log_ticks(lo: int, hi: int) -> dict:
    """Tick settings of a log axis (or a log10 colour bar) labelled at decades only, never at 2 and 5."""
    return dict(tickmode="array", tickvals=[10.0 ** k for k in range(lo, hi + 1)],
                ticktext=[decade_text(k) for k in range(lo, hi + 1)])


def log_or_linear(fig: go.Figure, log: bool, values: list[float], title: str) -> None:
    """Zoom the y axis to the data (linear from 0) or use a log axis labelled at whole decades, for small
    quantities."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if log:
        lo, hi = decades(finite)
        fig.update_yaxes(type="log", title=title + " — log scale", range=[lo - 0.05, hi + 0.12],
                         minor=dict(showgrid=True, dtick="D1"), **log_ticks(lo, hi))
    else:
        top = max(finite or [1.0])
        fig.update_yaxes(title=title, range=[0, top * 1.18 if top > 0 else 1])


LAMBDA_FLOOR = 1.0  # λ = 1 keeps a unique update as it is (plain RAM): λ axes and colour scales start there


def lambda_top(values) -> float:
    """The top of a linear λ axis that starts at 1: the largest λ and room for its label (never a flat 1–1)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    top = max(finite + [LAMBDA_FLOOR])
    return max(top + 0.12 * (top - LAMBDA_FLOOR), LAMBDA_FLOOR + 0.05)


def error_bars(se, color: str = NEUTRAL) -> dict | None:
    """Plotly error bars of ± one standard error (`se`: one value per point, NaN/None for none; None: no bars),
    in the theme's neutral ink or, on lines that share their x values, in the line's own colour."""
    if se is None:
        return None
    vals = [0.0 if v is None or v != v else float(v) for v in se]
    return dict(type="data", array=vals, visible=True, color=color, thickness=1.2, width=3)

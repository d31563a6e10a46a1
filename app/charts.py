"""Plotly figure builders (pure: frames in, figures out), the palettes, and `show` (theme, title, downloads)."""
from __future__ import annotations

import math
import re

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import streamlit as st
from plotly.subplots import make_subplots

from analysis.names import in_module_order
from app.markup import plot_text
from merging import regions
from merging.escaping import csv_bytes

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
        xaxis=axis, yaxis=axis, hoverlabel=dict(font=dict(family=FONT["family"])), hovermode="closest",
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


def _layout(fig: go.Figure, height: int = 360, legend: bool = True, **kw) -> go.Figure:
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


def _subplot_titles(fig: go.Figure, lines: int = 1) -> None:
    """Room above the plots for subplot titles of `lines` lines (the chart's own title goes above them)."""
    fig.update_layout(margin=dict(t=10 + 18 * lines))
    fig.update_annotations(font=dict(size=13))


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


def _log_or_linear(fig: go.Figure, log: bool, values: list[float], title: str) -> None:
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


# ---------------------------------------------------------------- Heterogeneity

def density_bars(df: pd.DataFrame, agents: list[str]) -> go.Figure:
    """Paper Fig. 2 left: share of parameters each agent changed."""
    colors = agent_colors(agents)
    fig = go.Figure(go.Bar(x=agent_ticks(list(df["agent"])), y=100 * df["density"], customdata=labels(df["agent"]),
                           marker_color=[colors[a] for a in df["agent"]],
                           text=[f"{100 * d:.1f}%" for d in df["density"]], textposition="outside",
                           hovertemplate="%{customdata}: %{y:.2f}% of parameters changed<extra></extra>",
                           cliponaxis=False))
    fig.update_yaxes(title="changed parameters (% of all)", rangemode="tozero")
    fig.update_xaxes(title="agent")
    agent_axis(fig, list(df["agent"]))
    return _layout(fig, legend=False)


def overlap_stacked(df: pd.DataFrame, agents: list[str], chance: dict[str, float] | None = None) -> go.Figure:
    """Paper Fig. 2 right: of each agent's changed elements, how many agents changed them too. The unique
    share (and its chance level) is written above each bar: a thin segment stays readable."""
    n = int(df["k"].max())
    ticks = dict(zip(agents, agent_ticks(agents)))
    fig = go.Figure()
    for k in range(1, n + 1):
        part = df[df["k"] == k].set_index("agent").reindex(agents)
        name = "unique (only this agent)" if k == 1 else f"shared by {k} agents"
        fig.add_bar(x=list(ticks.values()), y=100 * part["fraction"], name=name, marker_color=OVERLAP_COLORS[(k - 1) % 6],
                    text=[f"{100 * v:.0f}%" if v >= 0.06 else "" for v in part["fraction"]], textposition="inside",
                    customdata=list(zip(labels(agents), part["count"])),
                    hovertemplate=f"%{{customdata[0]}}: %{{y:.3g}}% {name} (%{{customdata[1]:,}} elements)"
                                  "<extra></extra>")
    uniq = df[df["k"] == 1].set_index("agent")["fraction"].reindex(agents).fillna(0.0)
    few = len(agents) <= 3  # more, narrower bars: the numbers alone, the legend says what they are
    for a in agents:
        if few:
            text = f"unique {pct(uniq[a])}" + (f"<br>chance {pct(chance[a])}" if chance and a in chance else "")
        else:  # chance is on "Unique share against chance"
            text = pct(uniq[a])
        fig.add_annotation(x=ticks[a], y=100, text=text, showarrow=False, yanchor="bottom",
                           font=dict(size=11 if few else 9, color=UNIQUE_TEXT))
    if not few:
        fig.data[0].name = "unique (only this agent; % above the bars)"
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="share of the agent's changed elements (%)", range=[0, 118], tickvals=[0, 25, 50, 75, 100])
    fig.update_xaxes(title="agent")
    agent_axis(fig, agents)
    return _layout(fig, height=max(360, 120 + 34 * n), margin=dict(l=10, r=10, t=30 if chance and few else 18, b=10))


def unique_vs_chance_bars(df: pd.DataFrame, agents: list[str], log: bool = False) -> go.Figure:
    """Measured unique share of each agent's changed elements, with the share independent random masks of
    the same densities would give (◆): above chance means the agents' updates avoid each other."""
    colors = agent_colors(agents)
    d = df.set_index("agent").reindex(agents)
    xs, full = agent_ticks(agents), labels(agents)
    fig = go.Figure(go.Bar(x=xs, y=100 * d["unique_share"], name="measured", customdata=full,
                           marker_color=[colors[a] for a in agents],
                           text=[pct(v) for v in d["unique_share"]], textposition="outside", cliponaxis=False,
                           hovertemplate="%{customdata}: %{y:.3g}% of its changed elements are unique<extra></extra>"))
    fig.add_scatter(x=xs, y=100 * d["chance_unique_share"], mode="markers", customdata=full,
                    name="chance (independent masks)",
                    marker=dict(symbol="diamond", size=13, color=NEUTRAL, line=dict(color="white", width=1)),
                    hovertemplate="%{customdata}: %{y:.3g}% by chance<extra></extra>")
    values = list(100 * d["unique_share"]) + list(100 * d["chance_unique_share"])
    if "chance_unique_share_tensor" in d:
        fig.add_scatter(x=xs, y=100 * d["chance_unique_share_tensor"], mode="markers", customdata=full,
                        name="chance, tensor by tensor",
                        marker=dict(symbol="diamond-open", size=13, color=NEUTRAL, line=dict(width=2)),
                        hovertemplate="%{customdata}: %{y:.3g}% by chance with each tensor's own densities"
                                      "<extra></extra>")
        values += list(100 * d["chance_unique_share_tensor"])
    _log_or_linear(fig, log, values, "unique share of changed elements (%)")
    fig.update_xaxes(title="agent")
    agent_axis(fig, agents)
    return _layout(fig, margin=dict(l=10, r=10, t=16, b=10))


def layer_module_heatmaps(df: pd.DataFrame, agents: list[str], value: str = "density", log: bool = False,
                          colorbar: str = "changed<br>(%)", scale: float = 100.0) -> go.Figure:
    """One value per layer × module kind (density by default), one panel per agent, one shared colour scale."""
    colors = agent_colors(agents)
    heads = {a: tick_label(v) for a, v in short_labels(agents).items()}  # two lines when long: narrow panels
    fig = make_subplots(rows=1, cols=len(agents), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[f"<b style='color:{colors[a]}'>{heads[a]}</b>" for a in agents])
    log = log and value != "lambda"  # λ is a multiplier: a linear colour scale from 1; log is for ρ
    vals = scale * df[value].astype(float)
    raw_finite = [v for v in vals if pd.notna(v) and math.isfinite(v)]
    if log:
        vals = vals.where(vals > 0).map(lambda v: math.log10(v) if pd.notna(v) and math.isfinite(v) else None)
    data = df.assign(_v=vals)
    finite = [v for v in data["_v"] if v is not None and pd.notna(v) and math.isfinite(v)]
    zmin, zmax = (min(finite), max(finite)) if finite else (0.0, 1.0)
    bar_ticks = {}
    if log:  # whole decades, labelled in the value's own units (0.1, 1, 10), not in log10
        lo, hi = decades(raw_finite)
        zmin, zmax = lo, hi
        bar_ticks = dict(tickmode="array", tickvals=list(range(lo, hi + 1)), ticktext=[decade_text(k) for k in range(lo, hi + 1)])
    elif value == "lambda":
        zmin, zmax = LAMBDA_FLOOR, max(finite + [LAMBDA_FLOOR + 0.01])
    else:
        zmin, zmax = 0.0, max(zmax, 1e-9)
    modules = in_module_order(df["module"])  # model order, whatever order or dtype the frame has
    for i, agent in enumerate(agents, start=1):
        part = data[data["agent"] == agent]
        grid = part.assign(module=part["module"].astype(str)).pivot(index="module", columns="layer", values="_v")
        grid = grid.reindex(modules)  # modules absent from a layer stay blank (NaN), not 0
        xs = ["emb/head" if c == -1 else str(c) for c in grid.columns]
        raw = part.assign(module=part["module"].astype(str)).pivot(index="module", columns="layer", values=value)
        raw = raw.reindex(modules)
        fig.add_trace(go.Heatmap(z=grid.values, x=xs, y=labels(modules), coloraxis="coloraxis", customdata=raw.values,
                                 hovertemplate=f"{label(agent)} · layer %{{x}} · %{{y}}: %{{customdata:.4g}}"
                                               "<extra></extra>"),
                      row=1, col=i)
        fig.update_xaxes(title_text="layer", row=1, col=i, type="category")
    fig.update_yaxes(title_text="module", row=1, col=1, autorange="reversed")
    _subplot_titles(fig, max(t.count("<br>") + 1 for t in heads.values()))
    bar = dict(title=dict(text=colorbar + (" (log)" if log else ""), side="top"), thickness=12, **bar_ticks)
    fig.update_layout(coloraxis=dict(colorscale="Viridis", cmin=zmin, cmax=zmax, colorbar=bar))
    return _layout(fig, height=360, legend=False, margin=fig.layout.margin)


def unique_share_lines(df: pd.DataFrame, agents: list[str], log: bool = False) -> go.Figure:
    """Unique share of each agent's changed elements per layer (−1 = embeddings / head), with the chance level
    of independent masks of that layer's densities (dotted, same colour)."""
    colors, names = agent_colors(agents), agent_names(agents)
    fig = go.Figure()
    for agent in agents:
        part = df[df["agent"] == agent].sort_values("layer")
        xs = ["emb/head" if v == -1 else str(v) for v in part["layer"]]
        fig.add_scatter(x=xs, y=100 * part["unique_share"], mode="lines+markers", name=names[agent],
                        line=dict(color=colors[agent], width=2.5), legendgroup=label(agent),
                        hovertemplate=f"{label(agent)} · layer %{{x}}: %{{y:.3g}}% unique<extra></extra>")
        if "chance_unique_share" in part:  # one legend key for every dotted line (below), not one per agent
            fig.add_scatter(x=xs, y=100 * part["chance_unique_share"], mode="lines", name=f"{label(agent)}: chance",
                            line=dict(color=colors[agent], width=1.5, dash="dot"), legendgroup=label(agent),
                            showlegend=False,
                            hovertemplate=f"{label(agent)} · layer %{{x}}: %{{y:.3g}}% by chance<extra></extra>")
    if "chance_unique_share" in df:
        fig.add_scatter(x=[None], y=[None], mode="lines", name="dotted: chance", line=dict(color=NEUTRAL, dash="dot"),
                        hoverinfo="skip")
    values = list(100 * df["unique_share"]) + (list(100 * df["chance_unique_share"]) if "chance_unique_share" in df else [])
    _log_or_linear(fig, log, values, "unique share of changed elements (%)")
    fig.update_xaxes(title="layer", type="category")
    return _layout(fig)


def eps_curve(df: pd.DataFrame, agents: list[str], chosen: float | None = None) -> go.Figure:
    """Density against the threshold ε, one line per agent; the chosen ε is marked."""
    colors, names = agent_colors(agents), agent_names(agents)
    fig = go.Figure()
    for agent in agents:
        part = df[df["agent"] == agent].sort_values("eps")
        fig.add_scatter(x=[eps_label(e) for e in part["eps"]], y=100 * part["density"], mode="lines+markers",
                        name=names[agent], line=dict(color=colors[agent], width=2.5),
                        hovertemplate=f"{label(agent)} · ε=%{{x}}: %{{y:.2f}}% changed<extra></extra>")
    ticks = [eps_label(e) for e in sorted(df["eps"].unique())]
    if chosen is not None and eps_label(chosen) in ticks:  # category axis: position = index of the label
        fig.add_shape(type="line", xref="x", yref="paper", x0=ticks.index(eps_label(chosen)),
                      x1=ticks.index(eps_label(chosen)), y0=0, y1=1, line=dict(dash="dot", color=NEUTRAL))
    fig.update_yaxes(title="changed parameters (% of all)", rangemode="tozero")
    fig.update_xaxes(title="ε (|τ| threshold, weight units)", type="category")
    return _layout(fig)


def group_lines(df: pd.DataFrame, agents: list[str], by: str, value: str, title: str, log: bool,
                hover: str) -> go.Figure:
    """One value (ρ, λ, …) per layer (lines) or per module kind (grouped bars, model order), one colour per agent.
    λ is a multiplier: drawn linearly on an axis from 1 (its bars grow from 1); `log` applies to the others (ρ)."""
    colors, names = agent_colors(agents), agent_names(agents)
    fig = go.Figure()
    clean = df.assign(_v=df[value].astype(float).where(lambda s: s.map(math.isfinite)))
    is_lambda = value == "lambda"
    modules = in_module_order(clean["module"]) if by != "layer" else []
    for agent in agents:
        part = clean[clean["agent"] == agent]
        if by == "layer":
            part = part.sort_values("layer")
            xs = ["emb/head" if v == -1 else str(v) for v in part["layer"]]
            fig.add_scatter(x=xs, y=part["_v"], mode="lines+markers", name=names[agent], connectgaps=False,
                            line=dict(color=colors[agent], width=2.5),
                            hovertemplate=f"{label(agent)} · layer %{{x}}: {hover}=%{{y:.4g}}<extra></extra>")
        else:
            part = part.sort_values("module", key=lambda s: s.astype(str).map({m: i for i, m in enumerate(modules)}))
            ys = part["_v"] - LAMBDA_FLOOR if is_lambda else part["_v"]
            fig.add_bar(x=labels(part["module"].astype(str)), y=ys, base=LAMBDA_FLOOR if is_lambda else None,
                        name=names[agent], marker_color=colors[agent], customdata=part["_v"],
                        hovertemplate=f"{label(agent)} · %{{x}}: {hover}=%{{customdata:.4g}}<extra></extra>")
    fig.update_layout(barmode="group")
    if is_lambda:  # the log switch is for ρ only
        fig.update_yaxes(title=title + " (×; 1 = kept as is)", range=[LAMBDA_FLOOR, lambda_top(clean["_v"])])
    else:
        _log_or_linear(fig, log, list(clean["_v"].dropna()), title)
    fig.update_xaxes(title=by if by == "layer" else "module kind", type="category")
    if modules:
        fig.update_xaxes(categoryorder="array", categoryarray=labels(modules))
    return _layout(fig)


def norms_conflicts(df: pd.DataFrame, agents: list[str]) -> go.Figure:
    """Left: L2 norm of each agent's unique and shared updates. Right: sign conflicts, as a share of the
    agent's shared elements (another active agent moved the weight the other way)."""
    colors = agent_colors(agents)
    d = df.set_index("agent").reindex(agents)
    xs, full = agent_ticks(agents, narrow=True), labels(agents)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.16,
                        subplot_titles=["L2 norm of τ:<br>unique vs shared part", "sign conflicts:<br>% of shared"])
    fig.add_bar(x=xs, y=d["norm_unique"], name="unique part ‖τ_unique‖", marker_color=UNIQUE_COLOR, row=1, col=1,
                customdata=list(zip(full, 100 * d["unique_energy_share"])),
                hovertemplate="%{customdata[0]}: ‖τ_unique‖ = %{y:.4g} (%{customdata[1]:.2g}% of ‖τ‖²)<extra></extra>")
    fig.add_bar(x=xs, y=d["norm_shared"], name="shared part ‖τ_shared‖", marker_color=SHARED_COLOR, row=1, col=1,
                customdata=full, hovertemplate="%{customdata}: ‖τ_shared‖ = %{y:.4g}<extra></extra>")
    fig.add_bar(x=xs, y=100 * d["conflict_share"], marker_color=[colors[a] for a in agents], row=1, col=2,
                showlegend=False, text=[pct(v) for v in d["conflict_share"]], textposition="outside", cliponaxis=False,
                customdata=list(zip(full, d["sign_conflicts"])),
                hovertemplate="%{customdata[0]}: %{y:.3g}% of shared elements (%{customdata[1]:,}) have a sign "
                              "conflict<extra></extra>")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="L2 norm (weight units)", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="% of shared elements", row=1, col=2, rangemode="tozero")
    fig.update_xaxes(title_text="agent", row=1, col=1)
    fig.update_xaxes(title_text="agent", row=1, col=2)
    agent_axis(fig, agents, narrow=True)
    _layout(fig, height=380)
    _subplot_titles(fig, 2)
    return fig


def pair_matrix(df: pd.DataFrame, agents: list[str]) -> go.Figure:
    """Two agent × agent panels: sign agreement on the elements both changed (chance 50 %) and the cosine of the
    two updates there (chance 0), every cell written out; colours diverge from the chance value (blue above,
    red below), so a chance-level matrix is pale."""
    short = short_labels(agents)
    n = len(agents)
    idx = {a: i for i, a in enumerate(agents)}
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=["same sign (%) · chance 50 %", "cosine of the updates · chance 0"])
    for col, (value, scale, fmt, lo, hi) in enumerate([("sign_agreement", 100.0, "{:.1f}%", 30.0, 70.0),
                                                        ("cosine", 1.0, "{:+.3f}", -0.4, 0.4)], start=1):
        z = [[None] * n for _ in range(n)]
        text = [["" if i != j else "·" for j in range(n)] for i in range(n)]
        hover = [["" for _ in range(n)] for _ in range(n)]
        for r in df.itertuples():
            i, j = idx[r.a], idx[r.b]
            v = getattr(r, value)
            tip = (f"{label(r.a)} and {label(r.b)}<br>{int(r.both_changed):,} elements both changed "
                   f"(independent masks: {r.expected_both_tensor:,.0f})<br>same sign {100 * r.sign_agreement:.2f}% "
                   f"(unrelated updates: 50 ± {100 * r.sign_agreement_se:.2f})<br>cosine {r.cosine:+.4f}")
            for a, b in ((i, j), (j, i)):
                z[a][b] = None if v != v else scale * v
                text[a][b], hover[a][b] = ("–" if v != v else fmt.format(scale * v)), tip
        fig.add_trace(go.Heatmap(z=z, x=agent_ticks(agents), y=[label(short[a]) for a in agents],
                                 text=text,
                                 texttemplate="%{text}", textfont=dict(size=14), customdata=hover,
                                 hovertemplate="%{customdata}<extra></extra>", colorscale="RdBu", zmid=(lo + hi) / 2,
                                 zmin=lo, zmax=hi, xgap=3, ygap=3, showscale=False), row=1, col=col)
        fig.update_xaxes(showgrid=False, row=1, col=col)
        agent_axis(fig, agents, row=1, col=col)
        fig.update_yaxes(type="category", showgrid=False, autorange="reversed", row=1, col=col)
    _layout(fig, height=110 + 75 * n, legend=False)
    _subplot_titles(fig)
    return fig


ENERGY_PARTS = [("unique", "unique (kept whole by RAM)", UNIQUE_COLOR),
                ("partners", "shared, partners ≥ 30 % as large", "#B0B0B0"),
                ("dominant_30", "shared, partners 10–30 %", "#E69F00"),
                ("dominant_10", "shared, partners < 10 %", "#D55E00")]


def energy_profile(df: pd.DataFrame, agents: list[str]) -> go.Figure:
    """Where each agent's update energy Σ τ² lies: unique elements, and shared elements split by how large the
    other active agents' combined |τ| is next to the agent's own (averaging divides the dominant part although
    the partners barely moved)."""
    short = short_labels(agents)
    d = df.set_index("agent").reindex(agents)
    shared = d["shared_energy_share"].fillna(0.0)
    parts = {"unique": 1.0 - shared, "dominant_10": shared * d["dominated_10_share"].fillna(0.0),
             "dominant_30": shared * (d["dominated_30_share"] - d["dominated_10_share"]).fillna(0.0),
             "partners": shared * (1.0 - d["dominated_30_share"].fillna(0.0))}
    fig = go.Figure()
    for key, name, color in ENERGY_PARTS:
        v = 100 * parts[key]
        fig.add_bar(y=[label(short[a]) for a in agents], x=v, name=name, orientation="h", marker_color=color,
                    text=[f"{x:.0f}%" if x >= 7 else "" for x in v], textposition="inside", customdata=labels(agents),
                    hovertemplate=f"%{{customdata}}: %{{x:.1f}}% of its update energy Σ τ² is {name}<extra></extra>")
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="share of the agent's update energy Σ τ² (%)", range=[0, 100])
    fig.update_yaxes(autorange="reversed", type="category")
    return _layout(fig, height=max(190, 90 + 45 * len(agents)))


def agreement_by_group(df: pd.DataFrame, agents: list[str], by: str) -> go.Figure:
    """Per pair of agents, sign agreement (left, chance 50 %) and cosine (right, chance 0) per layer (lines) or
    module kind (bars): where agreement concentrates."""
    short = short_labels(agents)
    palette = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#8C564B", "#7F7F7F", "#999933",
               "#882255"]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=["same sign (%) · chance 50 %", "cosine · chance 0"])
    pairs = list(dict.fromkeys(zip(df["a"], df["b"])))
    for k, (a, b) in enumerate(pairs):
        part = df[(df["a"] == a) & (df["b"] == b)]
        name = label(f"{short[a]} – {short[b]}")
        xs = [("emb/head" if v == -1 else str(v)) if by == "layer" else str(v) for v in part[by]]
        hover = [f"{label(a)} – {label(b)} · {label(by)} {label(x)}: %{{y:.3g}} ({int(n):,} elements both "
                 f"changed)" for x, n in
                 zip(xs, part["both_changed"])]
        for col, value, scale in ((1, "sign_agreement", 100.0), (2, "cosine", 1.0)):
            kw = dict(x=xs, y=scale * part[value], name=name, legendgroup=name, showlegend=col == 1,
                      hovertext=hover, hovertemplate="%{hovertext}<extra></extra>")
            if by == "layer":
                fig.add_scatter(mode="lines+markers", line=dict(color=palette[k % len(palette)], width=2.5),
                                row=1, col=col, **kw)
            else:
                fig.add_bar(marker_color=palette[k % len(palette)], row=1, col=col, **kw)
    fig.add_hline(y=50, line=dict(dash="dot", color=NEUTRAL), row=1, col=1)
    fig.add_hline(y=0, line=dict(dash="dot", color=NEUTRAL), row=1, col=2)
    fig.update_layout(barmode="group")
    for col in (1, 2):
        fig.update_xaxes(title_text="layer" if by == "layer" else "module kind", type="category", row=1, col=col,
                         **({} if by == "layer" else dict(categoryorder="array",
                                                           categoryarray=in_module_order(df["module"]))))
    # at least 40–60 % and ±0.2: a chance-level profile looks flat, not magnified
    sa = [v for v in 100 * df["sign_agreement"] if v == v]
    co = [v for v in df["cosine"] if v == v]
    fig.update_yaxes(title_text="same sign (%)", range=[min([40.0, *sa]) - 2, max([60.0, *sa]) + 2], row=1, col=1)
    fig.update_yaxes(title_text="cosine", range=[min([-0.2, *co]) - 0.02, max([0.2, *co]) + 0.02], row=1, col=2)
    _layout(fig, height=380)
    _subplot_titles(fig)
    return fig


# ---------------------------------------------------------------- Tune

def wants_log_rho(rhos, alpha: float) -> bool:
    """Whether the λ(ρ) chart needs a log ρ axis: the agents' finite ρ_t span more than the curve's bend (one
    above 3·max(α, 1), or one under 0.05), so a linear axis would leave some of them off it or squashed."""
    finite = [v for v in rhos if math.isfinite(v) and v > 0]
    return bool(finite) and (max(finite) > 3 * max(alpha, 1.0) or min(finite) < 0.05)


def lambda_curve(lam: pd.DataFrame, agents: list[str], r: float, alpha: float, rule: str,
                 log: bool | None = None) -> go.Figure:
    """λ as a function of ρ for the chosen rule, with each agent's (ρ_t, λ_t) marked. On a log ρ axis
    (the default when the agents' ρ_t span more than the curve's bend) every agent is on the axis."""
    colors, names = agent_colors(agents), agent_names(agents)
    finite = [v for v in lam["rho"] if math.isfinite(v) and v > 0]
    if log is None:
        log = wants_log_rho(lam["rho"], alpha)
    if log:  # whole decades around the agents, α and 1
        dlo, dhi = decades([v / 2 for v in finite] + [v * 2 for v in finite] + [alpha if alpha > 0 else 1.0, 1.0])
        lo, hi = 10.0 ** dlo, 10.0 ** dhi
        xs = [lo * (hi / lo) ** (i / 300) for i in range(301)]
    else:
        hi = max([3.0, alpha * 1.5] + [v * 1.15 for v in finite])
        xs = [hi * i / 300 for i in range(301)]
    ys = [regions.lambda_from_rho(x, r, alpha, rule) for x in xs]
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines", name=f"λ(ρ), {rule} rule",
                               line=dict(color=NEUTRAL, width=2), hoverinfo="skip"))
    if rule == "clip" and alpha > 0:
        fig.add_vline(x=alpha, line=dict(dash="dot", color=NEUTRAL), annotation_text=f"α = {alpha:g}",
                      annotation_position="bottom right")
    for _, row in lam.iterrows():
        inf = not math.isfinite(row["rho"])
        zero = row["rho"] <= 0
        x = hi if inf else (xs[0] if (zero and log) else row["rho"])
        rho_text = "∞" if inf else f"{row['rho']:.3g}"
        fig.add_scatter(x=[x], y=[row["lambda"]], mode="markers", name=names.get(row["agent"], label(row["agent"])),
                        marker=dict(color=colors.get(row["agent"], NEUTRAL), size=13, line=dict(color="white", width=1.5),
                                    symbol="triangle-right" if inf else "circle"),
                        hovertemplate=f"{label(row['agent'])}: ρ={rho_text}, λ={row['lambda']:.4f}<extra></extra>",
                        cliponaxis=False)
    if log:
        fig.update_xaxes(type="log", title="ρ = shared / unique changed elements (ratio, log scale)",
                         range=[dlo, dhi], minor=dict(showgrid=True, dtick="D1"), **log_ticks(dlo, dhi))
    else:
        fig.update_xaxes(title="ρ = shared / unique changed elements (ratio)", range=[0, hi])
    # λ linear from 1 (a unique update kept as it is); the curve's ceiling 1 + r fixes the top
    fig.update_yaxes(title="λ (unique-update scale, ×)", range=[LAMBDA_FLOOR, lambda_top([*ys, *lam["lambda"], 1 + r])])
    return _layout(fig, height=340)


def retention_bars(df: pd.DataFrame, agents: list[str], colors: dict[str, str] | None = None) -> go.Figure:
    """Share of each agent's unique update that survives each method (agents keep their colours)."""
    colors, names = colors or agent_colors(agents), agent_names(agents)
    methods = list(dict.fromkeys(df["method"]))
    fig = go.Figure()
    for agent in agents:
        part = df[df["agent"] == agent].set_index("method").reindex(methods)
        fig.add_bar(x=[tick_label(m, 16) for m in methods], y=100 * part["retention"], name=names[agent],
                    marker_color=colors[agent], customdata=labels(methods),
                    text=[f"{100 * v:.0f}%" for v in part["retention"]], textposition="outside", cliponaxis=False,
                    hovertemplate=f"{label(agent)} · %{{customdata}}: %{{y:.1f}}% of its unique update kept"
                                  "<extra></extra>")
    fig.add_hline(y=100, line_dash="dot", line_color=NEUTRAL, annotation_text="fine-tuned agent",
                  annotation_position="top left")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="unique update kept (% of the agent's)", range=[0, max(140, 100 * df["retention"].max() + 20)])
    fig.update_xaxes(title="merge method")
    return _layout(fig, height=340)


def compare_bars(cmp: pd.DataFrame, agents: list[str]) -> go.Figure:
    """A | B: λ_t and the unique update RAM+ keeps (λ_t·‖τ_unique‖), per agent; B hatched."""
    colors = agent_colors(agents)
    d = cmp.set_index("agent").reindex(agents)
    xs, full = agent_ticks(agents), labels(agents)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=["λ_t (unique-update scale),<br>bars from 1", "unique update kept,<br>λ_t·‖τ_unique‖"])
    for tag, pattern in (("A", ""), ("B", "/")):
        for col, value, fmt in ((1, f"lambda_{tag}", ".4f"), (2, f"kept_{tag}", ".4g")):
            lam = col == 1  # λ bars grow from 1 (neutral), so 1.01 next to 1.20 reads as it is
            fig.add_bar(x=xs, y=d[value] - LAMBDA_FLOOR if lam else d[value], base=LAMBDA_FLOOR if lam else None,
                        customdata=list(zip(full, d[value])), name=f"setting {tag}", legendgroup=tag,
                        showlegend=col == 1, offsetgroup=tag, row=1, col=col,
                        marker=dict(color=[colors[a] for a in agents], pattern_shape=pattern,
                                    pattern_fillmode="overlay", line=dict(color=NEUTRAL, width=1)),
                        text=[f"{v:{fmt}}" for v in d[value]], textposition="outside", cliponaxis=False,
                        hovertemplate=f"%{{customdata[0]}} · {tag}: %{{customdata[1]:{fmt}}}<extra></extra>")
    fig.update_yaxes(title_text="λ_t (×; from 1 = kept as is)", row=1, col=1,
                     range=[LAMBDA_FLOOR, lambda_top(list(d["lambda_A"]) + list(d["lambda_B"]))])
    fig.update_yaxes(title_text="L2 norm (weight units)", rangemode="tozero", row=1, col=2)
    agent_axis(fig, agents)
    fig.update_layout(barmode="group")
    _layout(fig, height=380)
    _subplot_titles(fig, 2)
    return fig


# ---------------------------------------------------------------- Signal dilution toy

def toy_heatmaps(panels: list[tuple[str, object]], zmax: float, colors: list[str | None],
                 cols: int | None = None) -> go.Figure:
    """Small grids of task-vector values (one panel each), one diverging colour scale centred at 0."""
    cols = max(cols or 4, 1)
    rows = math.ceil(len(panels) / cols)
    # The agent's colour marks its panel with a square; the title itself is in the theme's ink (a dark A3 on the
    # dark theme or a pale A5 on white would be hard to read).
    titles = [("" if not t else f"<span style='color:{c}'>■</span> <b>{label(t)}</b>" if c else f"<b>{label(t)}</b>")
              for (t, _), c in zip(panels, colors)]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.03, vertical_spacing=0.12)
    for i, (title, grid) in enumerate(panels):
        r, c = i // cols + 1, i % cols + 1
        if grid is None:
            fig.update_xaxes(visible=False, row=r, col=c)
            fig.update_yaxes(visible=False, row=r, col=c)
            continue
        fig.add_trace(go.Heatmap(z=grid, coloraxis="coloraxis", xgap=1, ygap=1,
                                 hovertemplate=f"{label(title)} · row %{{y}}, col %{{x}}: τ=%{{z:.2f}}<extra></extra>"),
                      row=r, col=c)
        fig.update_xaxes(showticklabels=False, showgrid=False, row=r, col=c)
        fig.update_yaxes(showticklabels=False, showgrid=False, autorange="reversed", row=r, col=c)
    fig.update_layout(coloraxis=dict(colorscale="RdBu", cmid=0, cmin=-zmax, cmax=zmax,
                                     colorbar=dict(title=dict(text="τ (weight Δ)", side="top"), thickness=12)))
    return _layout(fig, height=190 * rows + 40, legend=False)


# ---------------------------------------------------------------- Demo evidence

def table1_bars(df: pd.DataFrame, model_col: str, metrics: list[str], agents: list[str]) -> go.Figure:
    """Grouped bars: one group per model row, one bar per task (coloured like the agent trained on it)."""
    colors = agent_colors(agents)
    spare = [c for c in ["#555555", "#999999", *AGENT_PALETTE] if c not in colors.values()]
    fig = go.Figure()
    for i, m in enumerate(metrics):
        color = colors.get(m) or (NEUTRAL if m == "avg" else spare[i % len(spare)])
        models = list(df[model_col].astype(str))
        fig.add_bar(x=[tick_label(n, 16) for n in models], y=df[m], customdata=labels(models),
                    name="average" if m == "avg" else f"{label(m)} task", marker_color=color,
                    hovertemplate=f"%{{customdata}} · {label(m)}: %{{y:.1f}}<extra></extra>")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="accuracy (%)", rangemode="tozero")
    fig.update_xaxes(title="model")
    return _layout(fig, height=360)


def fig3_bars(df: pd.DataFrame, agents: list[str]) -> go.Figure:
    """Paper Fig. 3 on the demo: for each agent, its own task's accuracy with only its unique region kept,
    whole (unique) and divided by N (unique ÷ N), between the base and the full agent."""
    colors = agent_colors(agents)
    fig = go.Figure()
    variants = [("base", "base", NEUTRAL, ""), ("unique", "unique region only", None, ""),
                ("unique_div_N", "unique region ÷ N", None, "/"), ("agent", "full agent", None, "x")]
    for variant, name, fixed, pattern in variants:
        part = df[df["variant"] == variant].set_index("agent").reindex(agents)
        if part["accuracy"].isna().all():
            continue
        fig.add_bar(x=agent_ticks(agents), y=part["accuracy"], name=name,
                    marker=dict(color=[fixed or colors[a] for a in agents], pattern_shape=pattern,
                                pattern_fillmode="overlay", line=dict(color=NEUTRAL, width=1),
                                opacity=0.55 if variant == "agent" else 1.0),
                    text=[f"{v:.1f}" if pd.notna(v) else "" for v in part["accuracy"]], textposition="outside",
                    cliponaxis=False, customdata=list(zip(labels(agents), labels(part["task"].fillna("")))),
                    hovertemplate=f"%{{customdata[0]}} ({name}) on its task %{{customdata[1]}}: %{{y:.1f}}%"
                                  "<extra></extra>")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="accuracy on the agent's own task (%)", rangemode="tozero")
    fig.update_xaxes(title="agent whose unique region is kept")
    agent_axis(fig, agents)
    return _layout(fig, height=360)


def reward_curves(df: pd.DataFrame, agents: list[str], x: str, y: str, group: str) -> go.Figure:
    """Raw reward per step (faint) and its moving average (solid), one colour per agent."""
    colors = agent_colors(agents)
    short = short_labels([str(n) for n in dict.fromkeys(df[group])])
    fig = go.Figure()
    for name, part in df.groupby(group, sort=False):
        part = part.sort_values(x)
        color = colors.get(str(name), None)
        window = max(1, len(part) // 15)
        fig.add_scatter(x=part[x], y=part[y], mode="lines", line=dict(color=color, width=1), opacity=0.25,
                        showlegend=False, hoverinfo="skip")
        fig.add_scatter(x=part[x], y=part[y].rolling(window, min_periods=1).mean(), mode="lines",
                        name=label(short[str(name)]), line=dict(color=color, width=2.5),
                        hovertemplate=f"{label(name)} · step %{{x}}: %{{y:.2f}} (moving average of {window})"
                                      "<extra></extra>")
    fig.update_xaxes(title=f"{label(x)} (RL updates)")
    fig.update_yaxes(title=f"{label(y.replace('_', ' '))} (fraction correct)")
    return _layout(fig, height=340)


# ---------------------------------------------------------------- Sweep

METHOD_SHORT = {"average": "avg", "task_arithmetic": "TA", "ties": "TIES", "dare_ta": "DARE-TA",
                "dare_ties": "DARE-TIES", "ram": "RAM", "ram_plus": "RAM+", "ram_plus_soft": "RAM+s",
                "unique_only": "unique"}
PARAM_SHORT = {"lambda": "λ", "density": "d", "drop_rate": "p", "eps": "ε", "alpha": "α", "rho_scope": "ρ",
               "r": "r", "seed": "seed", "agent": "agent", "dilute": "÷N"}


def short_text(text: str, limit: int = 18) -> str:
    """A label that fits a tick or a legend: the start of `text` and an ellipsis (the full text goes on hover)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def short_candidate_labels(names: list[str], limit: int = 18) -> list[str]:
    """Distinct short labels for `names`: the start and an ellipsis; where two would read the same (e.g.
    Qwen2.5-7B-Instruct and Qwen2.5-7B-Instruct-ToolRL-grpo-cold), the start and the end around it."""
    out = [short_text(n, limit) for n in names]
    clash = [out.count(label) > 1 for label in out]
    head = (limit - 1) // 2
    out = [n[:head] + "…" + n[-(limit - 1 - head):] if c and len(n) > limit else label
           for n, label, c in zip(names, out, clash)]
    seen: dict[str, int] = {}
    for i, label in enumerate(out):  # still equal (or equal names): number them
        seen[label] = seen.get(label, 0) + 1
        if out.count(label) > 1:
            out[i] = f"{label} ({seen[label]})"
    return out


def short_candidate(method: str, params: dict[str, object], given: list[str]) -> str:
    """`TIES λ=1 d=0.2` for `ties lambda=1.0 density=0.2`: method and the swept parameters, abbreviated."""
    def value(v: object) -> str:
        return eps_label(v) if isinstance(v, float) and 0 < abs(v) < 1e-3 else (f"{v:g}" if isinstance(v, float)
                                                                               else short_text(str(v), 10))

    bits = [f"{PARAM_SHORT.get(k, k)}={value(params[k])}" for k in given if k in params]
    return " ".join([METHOD_SHORT.get(method, short_text(method, 12)), *bits])


def _task_colors(tasks: list[str], agents: list[str]) -> dict[str, str]:
    """A task is coloured like the agent trained on it (same name); when no agent is named after the tasks,
    the tasks take the palette in order; the average is grey."""
    colors = agent_colors(agents)
    if not any(t in colors for t in tasks):
        colors = {}
    spare = [c for c in AGENT_PALETTE if c not in colors.values()]
    out, k = {}, 0
    for t in tasks:
        if t not in colors:
            colors[t], k = spare[k % len(spare)], k + 1
        out[t] = colors[t]
    return out | {"average": NEUTRAL}


def sweep_param_lines(df: pd.DataFrame, param: str, tasks: list[str], agents: list[str]) -> go.Figure:
    """The paper's Table 2 view: score against one swept parameter, one line per task and the average
    (dashed); `df` holds one method's candidates on one split, one row each, with `candidate` for hover."""
    colors = _task_colors(tasks, agents)
    d = df.sort_values(param, key=lambda s: s.map(lambda v: (0, v) if isinstance(v, (int, float)) else (1, str(v))))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in d[param])
    xs = list(d[param]) if numeric else [str(v) for v in d[param]]
    fig = go.Figure()
    for t in [*tasks, "average"]:
        fig.add_scatter(x=xs, y=d[t], mode="lines+markers", name=short_text(t, 24),
                        line=dict(color=colors[t], width=3 if t == "average" else 2,
                                  dash="dash" if t == "average" else "solid"),
                        customdata=d["candidate"], hovertemplate=f"{t}: %{{y:.2f}}%<br>%{{customdata}}<extra></extra>")
    best = d.loc[d["average"].idxmax()] if len(d) else None
    if best is not None:
        x = best[param] if numeric else str(best[param])
        fig.add_scatter(x=[x], y=[best["average"]], mode="markers", name="best average",
                        marker=dict(symbol="star", size=16, color=NEUTRAL, line=dict(color="white", width=1)),
                        hovertemplate=f"best average: %{{y:.2f}}%<br>{best['candidate']}<extra></extra>")
    short = PARAM_SHORT.get(param, param)
    fig.update_xaxes(title=param if short == param else f"{param} ({short})", type="linear" if numeric else "category")
    fig.update_yaxes(title="accuracy (%)", rangemode="tozero")
    return _layout(fig, height=380)


def sweep_time_scatter(df: pd.DataFrame) -> go.Figure:
    """The paper's Fig. 9 view: each candidate's average score against the seconds its merge took, one colour
    per method (one row per candidate; `short` and `candidate` labels)."""
    fig = go.Figure()
    methods = list(dict.fromkeys(df["method"]))
    for i, m in enumerate(methods):
        part = df[df["method"] == m]
        fig.add_scatter(x=part["merge_s"], y=part["average"], mode="markers", name=METHOD_SHORT.get(m, short_text(m)),
                        marker=dict(size=11, color=AGENT_PALETTE[i % len(AGENT_PALETTE)], line=dict(color="white", width=1),
                                    symbol=["star" if s else "circle" for s in part["selected"]]),
                        customdata=part["candidate"],
                        hovertemplate="%{customdata}<br>merge %{x:.3f} s · average %{y:.2f}%<extra></extra>")
    fig.update_xaxes(title="merge time (s, in memory)", rangemode="tozero")
    fig.update_yaxes(title="average accuracy (%)")
    return _layout(fig, height=360)


def sweep_task_bars(df: pd.DataFrame, tasks: list[str], agents: list[str]) -> go.Figure:
    """The chosen candidates next to the base and the agents: one group per model (short label, full name on
    hover), one bar per task and the average; `df` has columns name, short, and the tasks."""
    colors = _task_colors(tasks, agents)
    fig = go.Figure()
    for t in [*tasks, "average"]:
        fig.add_bar(x=[tick_label(v) for v in df["short"]], y=df[t], name=short_text(t, 24), marker_color=colors[t],
                    customdata=labels(df["name"]),
                    hovertemplate=f"%{{customdata}}<br>{t}: %{{y:.2f}}%<extra></extra>")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="accuracy (%)", rangemode="tozero")
    fig.update_xaxes(title="model", type="category")
    return _layout(fig, height=400)


# ---------------------------------------------------------------- rendering

def theme() -> str:
    """The theme the browser shows ('light' or 'dark'; Streamlit follows the system preference)."""
    try:
        kind = st.context.theme.type
    except Exception:  # noqa: BLE001 — no browser context (bare script): light
        kind = None
    return "dark" if kind == "dark" else "light"


def export_name(name: str, params: dict[str, object] | None) -> str:
    """File name of a downloaded figure: the chart's name and its parameters, e.g.
    'density_per_agent__eps-1e-5__agents-code+memory+tool'."""
    parts = [name]
    for key, value in (params or {}).items():
        if isinstance(value, (list, tuple)):
            value = "+".join(str(v) for v in value)
        elif isinstance(value, float):
            value = eps_label(value) if key in ("eps", "ε") else f"{value:g}"
        parts.append(f"{key}-{value}")
    text = "__".join(re.sub(r"[^A-Za-z0-9.+=-]+", "_", p).strip("_") for p in parts)
    return text[:180]


PAGE_WIDTH = 1000  # px a full-width chart gets in the wide layout at 1400 px (sidebar open): titles wrap to fit
TITLE_PX, SUBTITLE_PX = 8.8, 6.6  # generous widths of a character of the bold 16 px title and the 12 px subtitle


def styled(fig: go.Figure, title: str, subtitle: str = "", kind: str | None = None, width: float = 1.0) -> go.Figure:
    """The figure with its title (and a subtitle naming its parameters) and the page's theme. Both wrap to the
    chart's width (`width`: its share of the page) and sit in a band added above the plot, sized to their
    lines, above any subplot titles the figure reserves room for; legends stand beside the plot (`_layout`)."""
    px = PAGE_WIDTH * width - 30
    lines = wrap(title, max(20, int(px / TITLE_PX)))
    sub = wrap(subtitle, max(30, int(px / SUBTITLE_PX))) if subtitle else []
    text = "<br>".join(f"<b>{label(t)}</b>" for t in lines)
    if sub:
        text += "<br>" + "<br>".join(f"<span style='font-size:12px;color:{NEUTRAL}'>{label(t)}</span>" for t in sub)
    band = 38 + 21 * (len(lines) + len(sub) - 1)  # plotly spaces every line at 1.3 × the title's 16 px
    top = fig.layout.margin.t if fig.layout.margin.t is not None else 10
    fig.update_layout(template=f"ram_{kind or theme()}",
                      title=dict(text=text, x=0, xanchor="left", xref="container", yref="container", y=1,
                                 yanchor="top", pad=dict(t=24, l=12), font=dict(size=16)),  # pad: first baseline
                      margin=dict(t=top + band), height=(fig.layout.height or 360) + band)
    return fig


# Subtitles name parameters by their symbols, as the forms' labels do (eps → ε, alpha → α, …).
SUBTITLE_NAMES = {"eps": "ε", "alpha": "α", "lambda": "λ", "drop_rate": "p", "rho_scope": "ρ scope", "scope": "ρ scope"}


def _params_text(params: dict[str, object]) -> str:
    bits = []
    for key, value in (params or {}).items():
        if isinstance(value, (list, tuple)):
            value = ", ".join(str(v) for v in value)
        elif isinstance(value, float):
            value = eps_label(value) if key in ("eps", "ε") else f"{value:g}"
        bits.append(f"{SUBTITLE_NAMES.get(key, key)} = {value}" if key != "agents" else f"agents: {value}")
    return " · ".join(bits)


def subtitle_of(params: dict[str, object] | None) -> str:
    """The subtitle naming a chart's parameters: ε = 1e-5 · r = 0.1 · agents (by the names the chart shows)."""
    params = dict(params or {})
    if isinstance(params.get("agents"), (list, tuple)):
        params["agents"] = list(short_labels([str(a) for a in params["agents"]]).values())
    return _params_text(params)


def show(fig: go.Figure, data: pd.DataFrame, caption: str, name: str, *, title: str,
         params: dict[str, object] | None = None, width: float = 1.0) -> None:
    """A titled chart with its one-line caption, a CSV download of exactly the data it draws, and a camera
    button that downloads the figure (PNG at print scale or SVG, chosen in the sidebar) named after the chart
    and its parameters."""
    fmt = FIG_FORMATS.get(st.session_state.get(FIG_FORMAT_KEY, ""), "png")
    styled(fig, title, subtitle_of(params), width=width)
    filename = export_name(name, params)
    st.plotly_chart(fig, width="stretch", theme=None, key=f"chart_{name}",
                    config={"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "select2d"],
                            "toImageButtonOptions": {"format": fmt, "filename": filename, "width": EXPORT_WIDTH,
                                                     "height": int(fig.layout.height),
                                                     "scale": EXPORT_SCALE if fmt == "png" else 1}})
    c1, c2 = st.columns([4, 1], vertical_alignment="top")
    c1.caption(caption)
    c2.download_button("CSV", csv_bytes(data), file_name=f"{filename}.csv", mime="text/csv",
                       key=f"csv_{name}", icon=":material/download:", type="tertiary",
                       help="Download the data behind this chart")

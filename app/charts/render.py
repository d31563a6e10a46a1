"""Drawing a figure on a page: the theme, the title and subtitle, the export name, the downloads (`show`)."""
from __future__ import annotations

import re
import uuid

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.tables import csv_later

from .base import EXPORT_SCALE, EXPORT_WIDTH, FIG_FORMAT_KEY, FIG_FORMATS, NEUTRAL, eps_label, label, short_labels, wrap
from .layout import GAP_PX, PAIR_PX, fit

# An empty chart in a hidden container, drawn while a long pass runs (`load_library`): the browser loads and
# compiles the chart library (megabytes of JavaScript, seconds on a slow machine) during the wait instead of after
# it, when the page's charts arrive.
LIBRARY_KEY = "plotly_loader"
LIBRARY_CSS = f"[class*='st-key-{LIBRARY_KEY}-']{{display:none}}"


def load_library():
    """Draw the hidden empty chart that makes the browser load the chart library now; returns its place, an
    `st.empty` (call its `.empty()` when the pass is done: the chart goes in the same run)."""
    tag = uuid.uuid4().hex[:8]  # a page may run two passes (the dilution page's two trios)
    slot = st.empty()
    place = slot.container(key=f"{LIBRARY_KEY}-{tag}", border=False)
    place.plotly_chart(go.Figure(), key=f"{LIBRARY_KEY}-chart-{tag}", width="stretch", theme=None,
                       config={"staticPlot": True})
    return slot


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


PAGE_WIDTH = 540  # px of a full-width chart when the page's width is not known: a 1000 px window, sidebar open
TITLE_PX, SUBTITLE_PX = 8.8, 6.6  # generous widths of a character of the bold 16 px title and the 12 px subtitle


def styled(fig: go.Figure, title: str, subtitle: str = "", kind: str | None = None, width: float = 1.0,
           px: float | None = None) -> go.Figure:
    """The figure with its title (and a subtitle naming its parameters) and the page's theme, laid out for the
    width it is drawn at (`px`; else `width`, a share of PAGE_WIDTH) by the one rule, `layout.fit`: the title
    and subtitle wrap to it and sit in a band above everything else; the legend stands beside the plot or above
    it; panels, ticks and value labels fit."""
    px = float(px or PAGE_WIDTH * width)
    lines = wrap(title, max(12, int((px - 30) / TITLE_PX)))
    sub = wrap(subtitle, max(20, int((px - 30) / SUBTITLE_PX))) if subtitle else []
    text = "<br>".join(f"<b>{label(t)}</b>" for t in lines)
    if sub:
        text += "<br>" + "<br>".join(f"<span style='font-size:12px;color:{NEUTRAL}'>{label(t)}</span>" for t in sub)
    band = 38 + 21 * (len(lines) + len(sub) - 1)  # plotly spaces every line at 1.3 × the title's 16 px
    fig.update_layout(template=f"ram_{kind or theme()}",
                      title=dict(text=text, x=0, xanchor="left", xref="container", yref="container", y=1,
                                 yanchor="top", pad=dict(t=24, l=12), font=dict(size=16)))  # pad: first baseline
    return fit(fig, px, band)


def chart_px(width: float = 1.0) -> int:
    """The px a chart gets that takes `width` of the page's main column (a column of a row takes its share
    less its part of the gaps)."""
    from app.viewport import content_width

    page = content_width()
    return int(page * width - GAP_PX * (1 - width)) if width < 1 else page


def pair(n: int = 2) -> tuple[list, float]:
    """Places for `n` charts: side by side when each gets at least layout.PAIR_PX, else one under the other at
    the full width; and the share of the width each gets (for `show`)."""
    places, shares = beside([1.0] * n, [PAIR_PX] * n)
    return places, shares[0]


def beside(weights: list[float], min_px: list[int]) -> tuple[list, list[float]]:
    """Columns of relative `weights` when each gets at least its `min_px` of the page's main column, else one
    container under another at the full width; with each place's share of the width (for `show`)."""
    from app.viewport import content_width

    page, total = content_width(), sum(weights)
    shares = [w / total for w in weights]
    if all(page * s - GAP_PX * (1 - s) >= m for s, m in zip(shares, min_px)):
        return list(st.columns(weights)), shares
    return [st.container() for _ in weights], [1.0] * len(weights)


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
    px = chart_px(width)
    styled(fig, title, subtitle_of(params), px=px)
    filename = export_name(name, params)
    # The download keeps the layout drawn here (at its width), scaled to EXPORT_WIDTH × EXPORT_SCALE px wide.
    st.plotly_chart(fig, width="stretch", theme=None, key=f"chart_{name}",
                    config={"displaylogo": False, "responsive": True,
                            "modeBarButtonsToRemove": ["lasso2d", "select2d"],
                            "toImageButtonOptions": {"format": fmt, "filename": filename, "width": px,
                                                     "height": int(fig.layout.height),
                                                     "scale": EXPORT_WIDTH * EXPORT_SCALE / px if fmt == "png"
                                                     else 1}})
    row = st.container(horizontal=True, vertical_alignment="top", gap="small")
    row.caption(caption, width="stretch")  # the button keeps its width; the caption wraps beside it
    row.download_button("CSV", csv_later(data), file_name=f"{filename}.csv", mime="text/csv",
                        key=f"csv_{name}", icon=":material/download:", type="tertiary", width="content",
                        help="Download the data behind this chart")

"""The Signal dilution page's figures: the toy's task vectors, mini Table 1, Fig. 3 and the RL reward curves."""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .base import (
    AGENT_PALETTE,
    NEUTRAL,
    agent_axis,
    agent_colors,
    agent_ticks,
    chart_layout,
    error_bars,
    label,
    labels,
    short_labels,
    tick_label,
)


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
    return chart_layout(fig, height=190 * rows + 40, legend=False)


# ---------------------------------------------------------------- Demo evidence


def table1_bars(df: pd.DataFrame, model_col: str, metrics: list[str], agents: list[str]) -> go.Figure:
    """Grouped bars: one group per model row, one bar per task (coloured like the agent trained on it), with
    ± one standard error as error bars where the table has `<metric>_se`."""
    colors = agent_colors(agents)
    spare = [c for c in ["#555555", "#999999", *AGENT_PALETTE] if c not in colors.values()]
    fig = go.Figure()
    for i, m in enumerate(metrics):
        color = colors.get(m) or (NEUTRAL if m == "avg" else spare[i % len(spare)])
        models = list(df[model_col].astype(str))
        se = df[f"{m}_se"] if f"{m}_se" in df.columns else None
        fig.add_bar(x=[tick_label(n, 16) for n in models], y=df[m],
                    customdata=list(zip(labels(models), ["" if se is None or pd.isna(v) else f" ± {v:.1f}"
                                                         for v in (se if se is not None else df[m])])),
                    name="average" if m == "avg" else f"{label(m)} task", marker_color=color,
                    error_y=error_bars(se),
                    hovertemplate=f"%{{customdata[0]}} · {label(m)}: %{{y:.1f}}%{{customdata[1]}}<extra></extra>")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="accuracy (%)", rangemode="tozero")
    fig.update_xaxes(title="model")
    return chart_layout(fig, height=360)


def fig3_bars(df: pd.DataFrame, agents: list[str]) -> go.Figure:
    """Paper Fig. 3 on the demo: for each agent, its own task's accuracy with only its unique region kept,
    whole (unique) and divided by N (unique ÷ N), between the base and the full agent; ± one standard error
    where `df` has `se`."""
    colors = agent_colors(agents)
    fig = go.Figure()
    variants = [("base", "base", NEUTRAL, ""), ("unique", "unique region only", None, ""),
                ("unique_div_N", "unique region ÷ N", None, "/"), ("agent", "full agent", None, "x")]
    for variant, name, fixed, pattern in variants:
        part = df[df["variant"] == variant].set_index("agent").reindex(agents)
        if part["accuracy"].isna().all():
            continue
        fig.add_bar(x=agent_ticks(agents), y=part["accuracy"], name=name,
                    error_y=error_bars(part["se"]) if "se" in part.columns and part["se"].notna().any() else None,
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
    return chart_layout(fig, height=360)


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
    return chart_layout(fig, height=340)

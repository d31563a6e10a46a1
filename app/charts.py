"""Plotly figure builders (pure: frames in, figures out) and the one palette used by every chart."""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from merging import regions

# Okabe-Ito: colour-blind safe; agent i always gets AGENT_PALETTE[i] in every chart.
AGENT_PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
# Overlap count k: purple = unique to one agent, greys = shared (darker = more agents); no agent colour reused.
OVERLAP_COLORS = ["#7B3294", "#C8C8C8", "#9A9A9A", "#6E6E6E", "#474747", "#2A2A2A"]
FONT = dict(family="Source Sans Pro, Arial, sans-serif", size=13)


def agent_colors(agents: list[str]) -> dict[str, str]:
    """Colour of each agent, by its position in the selection (the same on every page)."""
    return {a: AGENT_PALETTE[i % len(AGENT_PALETTE)] for i, a in enumerate(agents)}


def _layout(fig: go.Figure, height: int = 360, legend: bool = True, **kw) -> go.Figure:
    fig.update_layout(template="plotly_white", height=height, font=FONT, margin=dict(l=10, r=10, t=40, b=10),
                      showlegend=legend, legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0,
                                                     title_text=""), **kw)
    return fig


def eps_label(eps: float) -> str:
    return "0" if eps == 0 else f"{eps:.0e}".replace("e-0", "e-")


# ---------------------------------------------------------------- Heterogeneity

def density_bars(df: pd.DataFrame, agents: list[str]) -> go.Figure:
    """Paper Fig. 2 left: share of parameters each agent changed."""
    colors = agent_colors(agents)
    fig = go.Figure(go.Bar(x=df["agent"], y=100 * df["density"], marker_color=[colors[a] for a in df["agent"]],
                           text=[f"{100 * d:.1f}%" for d in df["density"]], textposition="outside",
                           hovertemplate="%{x}: %{y:.2f}% of parameters changed<extra></extra>", cliponaxis=False))
    fig.update_yaxes(title="changed parameters (% of all)", rangemode="tozero")
    fig.update_xaxes(title="agent")
    return _layout(fig, legend=False)


def overlap_stacked(df: pd.DataFrame, agents: list[str]) -> go.Figure:
    """Paper Fig. 2 right: of each agent's changed elements, how many agents changed them too."""
    n = int(df["k"].max())
    shades = OVERLAP_COLORS
    fig = go.Figure()
    for k in range(1, n + 1):
        part = df[df["k"] == k].set_index("agent").reindex(agents)
        name = "unique (only this agent)" if k == 1 else f"shared by {k} agents"
        fig.add_bar(x=agents, y=100 * part["fraction"], name=name, marker_color=shades[(k - 1) % len(shades)],
                    text=[f"{100 * v:.0f}%" if v >= 0.06 else "" for v in part["fraction"]], textposition="inside",
                    hovertemplate=f"%{{x}}: %{{y:.1f}}% {name}<extra></extra>")
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="share of the agent's changed elements (%)", range=[0, 100])
    fig.update_xaxes(title="agent")
    return _layout(fig)


def layer_module_heatmaps(df: pd.DataFrame, agents: list[str]) -> go.Figure:
    """Density per layer × module kind, one panel per agent, one shared colour scale."""
    colors = agent_colors(agents)
    fig = make_subplots(rows=1, cols=len(agents), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[f"<b style='color:{colors[a]}'>{a}</b>" for a in agents])
    zmax = max(1e-9, float(df["density"].max()) * 100)
    modules = [str(m) for m in df["module"].cat.categories] if hasattr(df["module"], "cat") else sorted(df["module"].unique())
    for i, agent in enumerate(agents, start=1):
        part = df[df["agent"] == agent]
        grid = part.assign(module=part["module"].astype(str)).pivot(index="module", columns="layer", values="density")
        grid = grid.reindex(modules)  # modules absent from a layer stay blank (NaN), not 0
        xs = ["emb/head" if c == -1 else str(c) for c in grid.columns]
        fig.add_trace(go.Heatmap(z=100 * grid.values, x=xs, y=modules, coloraxis="coloraxis",
                                 hovertemplate=f"{agent} · layer %{{x}} · %{{y}}: %{{z:.2f}}% changed<extra></extra>"),
                      row=1, col=i)
        fig.update_xaxes(title_text="layer", row=1, col=i, type="category")
    fig.update_yaxes(title_text="module", row=1, col=1, autorange="reversed")
    fig.update_layout(coloraxis=dict(colorscale="Viridis", cmin=0, cmax=zmax,
                                     colorbar=dict(title=dict(text="changed<br>(%)", side="top"), thickness=12)))
    return _layout(fig, height=360, legend=False)


def unique_share_lines(df: pd.DataFrame, agents: list[str]) -> go.Figure:
    """Unique share of each agent's changed elements per layer (−1 = embeddings / head)."""
    colors = agent_colors(agents)
    fig = go.Figure()
    for agent in agents:
        part = df[df["agent"] == agent].sort_values("layer")
        fig.add_scatter(x=["emb/head" if v == -1 else str(v) for v in part["layer"]], y=100 * part["unique_share"],
                        mode="lines+markers", name=agent, line=dict(color=colors[agent], width=2.5),
                        hovertemplate=f"{agent} · layer %{{x}}: %{{y:.1f}}% unique<extra></extra>")
    fig.update_yaxes(title="unique share of changed elements (%)", range=[0, 105])
    fig.update_xaxes(title="layer", type="category")
    return _layout(fig)


def eps_curve(df: pd.DataFrame, agents: list[str], chosen: float | None = None) -> go.Figure:
    """Density against the threshold ε, one line per agent; the chosen ε is marked."""
    colors = agent_colors(agents)
    fig = go.Figure()
    for agent in agents:
        part = df[df["agent"] == agent].sort_values("eps")
        fig.add_scatter(x=[eps_label(e) for e in part["eps"]], y=100 * part["density"], mode="lines+markers",
                        name=agent, line=dict(color=colors[agent], width=2.5),
                        hovertemplate=f"{agent} · ε=%{{x}}: %{{y:.2f}}% changed<extra></extra>")
    labels = [eps_label(e) for e in sorted(df["eps"].unique())]
    if chosen is not None and eps_label(chosen) in labels:  # category axis: position = index of the label
        fig.add_shape(type="line", xref="x", yref="paper", x0=labels.index(eps_label(chosen)),
                      x1=labels.index(eps_label(chosen)), y0=0, y1=1, line=dict(dash="dot", color="#555"))
    fig.update_yaxes(title="changed parameters (% of all)", rangemode="tozero")
    fig.update_xaxes(title="ε (|τ| threshold, weight units)", type="category")
    return _layout(fig)


# ---------------------------------------------------------------- Tune

def lambda_curve(lam: pd.DataFrame, agents: list[str], r: float, alpha: float, rule: str) -> go.Figure:
    """λ as a function of ρ for the chosen rule, with each agent's (ρ_t, λ_t) marked."""
    colors = agent_colors(agents)
    # The interesting part of the curve is ρ ≲ 2α; agents beyond the range sit on the right edge (▶).
    finite = [v for v in lam["rho"] if math.isfinite(v)]
    top = min(max([3.0, alpha * 1.5] + [v * 1.15 for v in finite]), max(3.0, 2.5 * alpha))
    xs = [top * i / 200 for i in range(201)]
    ys = [regions.lambda_from_rho(x, r, alpha, rule) for x in xs]
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines", name=f"λ(ρ), {rule} rule",
                               line=dict(color="#555", width=2), hoverinfo="skip"))
    for _, row in lam.iterrows():
        beyond = not math.isfinite(row["rho"]) or row["rho"] > top
        rho_text = "∞" if not math.isfinite(row["rho"]) else f"{row['rho']:.3g}"
        fig.add_scatter(x=[top if beyond else row["rho"]], y=[row["lambda"]], mode="markers", name=row["agent"],
                        marker=dict(color=colors.get(row["agent"], "#333"), size=13, line=dict(color="white", width=1.5),
                                    symbol="triangle-right" if beyond else "circle"),
                        hovertemplate=f"{row['agent']}: ρ={rho_text}, λ={row['lambda']:.4f}<extra></extra>",
                        cliponaxis=False)
    fig.update_xaxes(title="ρ = shared / unique changed elements (ratio)", range=[0, top])
    fig.update_yaxes(title="λ (unique-update scale, ×)", range=[0.98, max(ys) + 0.02 + 0.05 * r])
    return _layout(fig, height=340)


def retention_bars(df: pd.DataFrame, agents: list[str]) -> go.Figure:
    """Share of each agent's unique update that survives each method (agents keep their colours)."""
    colors = agent_colors(agents)
    methods = list(dict.fromkeys(df["method"]))
    fig = go.Figure()
    for agent in agents:
        part = df[df["agent"] == agent].set_index("method").reindex(methods)
        fig.add_bar(x=methods, y=100 * part["retention"], name=agent, marker_color=colors[agent],
                    text=[f"{100 * v:.0f}%" for v in part["retention"]], textposition="outside", cliponaxis=False,
                    hovertemplate=f"{agent} · %{{x}}: %{{y:.1f}}% of its unique update kept<extra></extra>")
    fig.add_hline(y=100, line_dash="dot", line_color="#555", annotation_text="fine-tuned agent", annotation_position="top left")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="unique update kept (% of the agent's)", range=[0, max(140, 100 * df["retention"].max() + 20)])
    fig.update_xaxes(title="merge method")
    return _layout(fig, height=340)


# ---------------------------------------------------------------- Signal dilution toy

def toy_heatmaps(panels: list[tuple[str, object]], zmax: float, colors: list[str | None],
                 cols: int | None = None) -> go.Figure:
    """Small grids of task-vector values (one panel each), one diverging colour scale centred at 0."""
    cols = max(cols or 4, 1)
    rows = math.ceil(len(panels) / cols)
    titles = [("" if not t else f"<b style='color:{c}'>{t}</b>" if c else f"<b>{t}</b>")
              for (t, _), c in zip(panels, colors)]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.03, vertical_spacing=0.12)
    for i, (title, grid) in enumerate(panels):
        r, c = i // cols + 1, i % cols + 1
        if grid is None:
            fig.update_xaxes(visible=False, row=r, col=c)
            fig.update_yaxes(visible=False, row=r, col=c)
            continue
        fig.add_trace(go.Heatmap(z=grid, coloraxis="coloraxis", xgap=1, ygap=1,
                                 hovertemplate=f"{title} · row %{{y}}, col %{{x}}: τ=%{{z:.2f}}<extra></extra>"),
                      row=r, col=c)
        fig.update_xaxes(showticklabels=False, row=r, col=c)
        fig.update_yaxes(showticklabels=False, autorange="reversed", row=r, col=c)
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
        color = colors.get(m) or ("#555555" if m == "avg" else spare[i % len(spare)])
        fig.add_bar(x=df[model_col].astype(str), y=df[m], name="average" if m == "avg" else f"{m} task",
                    marker_color=color,
                    hovertemplate=f"%{{x}} · {m}: %{{y:.1f}}<extra></extra>")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="accuracy (%)", rangemode="tozero")
    fig.update_xaxes(title="model")
    return _layout(fig, height=360)


def reward_curves(df: pd.DataFrame, agents: list[str], x: str, y: str, group: str) -> go.Figure:
    """Raw reward per step (faint) and its moving average (solid), one colour per agent."""
    colors = agent_colors(agents)
    fig = go.Figure()
    for name, part in df.groupby(group, sort=False):
        part = part.sort_values(x)
        color = colors.get(str(name), None)
        window = max(1, len(part) // 15)
        fig.add_scatter(x=part[x], y=part[y], mode="lines", line=dict(color=color, width=1), opacity=0.25,
                        showlegend=False, hoverinfo="skip")
        fig.add_scatter(x=part[x], y=part[y].rolling(window, min_periods=1).mean(), mode="lines", name=str(name),
                        line=dict(color=color, width=2.5),
                        hovertemplate=f"{name} · step %{{x}}: %{{y:.2f}} (moving average of {window})<extra></extra>")
    fig.update_xaxes(title=f"{x} (RL updates)")
    fig.update_yaxes(title=f"{y.replace('_', ' ')} (fraction correct)")
    return _layout(fig, height=340)


# ---------------------------------------------------------------- rendering helper

def show(fig: go.Figure, data: pd.DataFrame, caption: str, name: str) -> None:
    """A chart with its one-line caption and a CSV download of exactly the data it draws."""
    st.plotly_chart(fig, width="stretch", theme=None, key=f"chart_{name}",
                    config={"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "select2d"]})
    c1, c2 = st.columns([4, 1], vertical_alignment="top")
    c1.caption(caption)
    c2.download_button("CSV", data.to_csv(index=False).encode(), file_name=f"{name}.csv", mime="text/csv",
                       key=f"csv_{name}", icon=":material/download:", type="tertiary",
                       help="Download the data behind this chart")

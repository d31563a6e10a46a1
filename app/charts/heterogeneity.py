"""The Heterogeneity page's figures: densities, overlaps, unique shares against chance, per-layer views, pair agreement,
energy."""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.names import in_module_order

from .base import (
    LAMBDA_FLOOR,
    NEUTRAL,
    OVERLAP_COLORS,
    SHARED_COLOR,
    UNIQUE_COLOR,
    UNIQUE_TEXT,
    agent_axis,
    agent_colors,
    agent_names,
    agent_ticks,
    chart_layout,
    decade_text,
    decades,
    eps_label,
    label,
    labels,
    lambda_top,
    log_or_linear,
    pct,
    room_for_subplot_titles,
    short_labels,
    tick_label,
)
from .layout import panels


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
    return chart_layout(fig, legend=False)


def overlap_stacked(df: pd.DataFrame, agents: list[str], chance: dict[str, float] | None = None) -> go.Figure:
    """Paper Fig. 2 right: of each agent's changed elements, how many agents changed them too. The unique
    share (and its chance level) is written above each bar: a thin segment stays readable."""
    n = int(df["k"].max())
    ticks = dict(zip(agents, agent_ticks(agents)))
    fig = go.Figure()
    for k in range(1, n + 1):
        part = df[df["k"] == k].set_index("agent").reindex(agents)
        name = "unique (only this agent)" if k == 1 else f"shared by {k} agents"
        fig.add_bar(x=list(ticks.values()), y=100 * part["fraction"], name=name,
                    marker_color=OVERLAP_COLORS[(k - 1) % 6],
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
    return chart_layout(fig, height=max(360, 120 + 34 * n),
                        margin=dict(l=10, r=10, t=30 if chance and few else 18, b=10))


def unique_vs_chance_bars(df: pd.DataFrame, agents: list[str], log: bool = False) -> go.Figure:
    """Measured unique share of each agent's changed elements, with the share independent random masks of
    the same densities would give: over the whole model (◆), tensor by tensor (◇) and per tensor × binade of
    the base weight (×); above chance means the agents' updates avoid each other."""
    colors = agent_colors(agents)
    d = df.set_index("agent").reindex(agents)
    xs, full = agent_ticks(agents), labels(agents)
    fig = go.Figure(go.Bar(x=xs, y=100 * d["unique_share"], name="measured", customdata=full,
                           marker_color=[colors[a] for a in agents],
                           # inside, at the bar's foot: above its top a chance marker may stand on the label
                           text=[pct(v) for v in d["unique_share"]], textposition="inside", insidetextanchor="start",
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
    if "chance_unique_share_binade" in d:
        fig.add_scatter(x=xs, y=100 * d["chance_unique_share_binade"], mode="markers", customdata=full,
                        name="chance, tensor × binade",
                        marker=dict(symbol="x-thin-open", size=13, color=NEUTRAL, line=dict(width=2.5)),
                        hovertemplate="%{customdata}: %{y:.3g}% by chance within each tensor's binades of |w_base| "
                                      "(one step size of the stored dtype each)<extra></extra>")
        values += list(100 * d["chance_unique_share_binade"])
    log_or_linear(fig, log, values, "unique share of changed elements (%)")
    fig.update_xaxes(title="agent")
    agent_axis(fig, agents)
    return chart_layout(fig, margin=dict(l=10, r=10, t=16, b=10))


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
        bar_ticks = dict(tickmode="array", tickvals=list(range(lo, hi + 1)),
                         ticktext=[decade_text(k) for k in range(lo, hi + 1)])
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
    room_for_subplot_titles(fig, max(t.count("<br>") + 1 for t in heads.values()))
    bar = dict(title=dict(text=colorbar + (" (log)" if log else ""), side="top"), thickness=12, **bar_ticks)
    fig.update_layout(coloraxis=dict(colorscale="Viridis", cmin=zmin, cmax=zmax, colorbar=bar))
    return panels(chart_layout(fig, height=360, legend=False, margin=fig.layout.margin), 160)


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
    chance = list(100 * df["chance_unique_share"]) if "chance_unique_share" in df else []
    values = list(100 * df["unique_share"]) + chance
    log_or_linear(fig, log, values, "unique share of changed elements (%)")
    fig.update_xaxes(title="layer", type="category")
    return chart_layout(fig)


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
    return chart_layout(fig)


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
        log_or_linear(fig, log, list(clean["_v"].dropna()), title)
    fig.update_xaxes(title=by if by == "layer" else "module kind", type="category")
    if modules:
        fig.update_xaxes(categoryorder="array", categoryarray=labels(modules))
    return chart_layout(fig)


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
    chart_layout(fig, height=380)
    room_for_subplot_titles(fig, 2)
    return panels(fig, 260)

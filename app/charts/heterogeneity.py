"""The Heterogeneity page's figures: densities, overlaps, unique shares against chance, per-layer views, pair agreement, energy."""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.names import in_module_order

from .base import (agent_axis, agent_colors, agent_names, agent_ticks, decade_text, decades, eps_label, label,
                   labels, LAMBDA_FLOOR, lambda_top, chart_layout, log_or_linear, NEUTRAL, OVERLAP_COLORS, pct,
                   SHARED_COLOR, short_labels, room_for_subplot_titles, tick_label, UNIQUE_COLOR, UNIQUE_TEXT)


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
    room_for_subplot_titles(fig, max(t.count("<br>") + 1 for t in heads.values()))
    bar = dict(title=dict(text=colorbar + (" (log)" if log else ""), side="top"), thickness=12, **bar_ticks)
    fig.update_layout(coloraxis=dict(colorscale="Viridis", cmin=zmin, cmax=zmax, colorbar=bar))
    return chart_layout(fig, height=360, legend=False, margin=fig.layout.margin)


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
    chart_layout(fig, height=110 + 75 * n, legend=False)
    room_for_subplot_titles(fig)
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
    return chart_layout(fig, height=max(190, 90 + 45 * len(agents)))


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
    chart_layout(fig, height=380)
    room_for_subplot_titles(fig)
    return fig

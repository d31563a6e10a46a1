"""The Heterogeneity page's structure figures: density per tower, and the MoE block — density per layer × expert
(routed experts, shared expert, router) and which agents changed each routed expert."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.experts import expert_columns

from .base import (
    NEUTRAL,
    agent_colors,
    agent_names,
    chart_layout,
    label,
    pct,
    room_for_subplot_titles,
    short_labels,
    tick_label,
)

SHARED_GREYS = ["#B8B8B8", "#969696", "#747474", "#545454", "#3A3A3A", "#262626", "#161616"]


def tower_bars(df, agents: list[str], value: str = "density") -> go.Figure:
    """Per tower (language, vision, audio), one bar per agent: its density there, or (`value` "unique_share")
    the unique share of its changes there with the chance level of independent masks (◆)."""
    colors, names = agent_colors(agents), agent_names(agents)
    towers = list(dict.fromkeys(df["tower"].astype(str)))
    unique = value == "unique_share"
    fig = go.Figure()
    for a in agents:
        part = df[df["agent"] == a].set_index("tower").reindex(towers)
        v = part[value].fillna(0)
        fig.add_bar(x=towers, y=100 * v, name=names[a], marker_color=colors[a], offsetgroup=a, legendgroup=a,
                    text=[pct(x) for x in v], textposition="outside", cliponaxis=False,
                    customdata=list(zip(part["changed"].fillna(0), 100 * part["chance_unique_share"].fillna(0))),
                    hovertemplate=f"{label(a)} · %{{x}}: %{{y:.3g}}% "
                                  + ("of its changes unique (chance %{customdata[1]:.3g}%)" if unique else
                                     "changed (%{customdata[0]:,} elements)") + "<extra></extra>")
        if unique:
            fig.add_scatter(x=towers, y=100 * part["chance_unique_share"].fillna(0), mode="markers",
                            offsetgroup=a, legendgroup=a, showlegend=False, hoverinfo="skip",
                            marker=dict(symbol="diamond", size=11, color=NEUTRAL, line=dict(color="white", width=1)))
    fig.update_layout(barmode="group", scattermode="group")
    fig.update_yaxes(title="unique share of changes (%)" if unique else "changed parameters (% of the tower)",
                     rangemode="tozero")
    fig.update_xaxes(title="tower", type="category")
    return chart_layout(fig, height=320)


def _layer_ticks(layers) -> list[str]:
    return [str(v) for v in layers]


def expert_heatmaps(df, agents: list[str]) -> go.Figure:
    """Density per layer × MoE column (routed experts by index, the shared expert, the router), one panel per
    agent, one colour scale; experts an agent left exactly unchanged stay blank."""
    colors = agent_colors(agents)
    heads = {a: tick_label(v, 40) for a, v in short_labels(agents, 40).items()}
    columns = expert_columns(df["column"])
    layers = sorted(set(int(v) for v in df["layer"]))
    per = max(90, 16 * len(layers) + 20)  # px per agent's panel
    gap = 44  # px between panels: room for the next panel's title
    fig = make_subplots(rows=len(agents), cols=1, shared_xaxes=True,
                        vertical_spacing=gap / (per * len(agents) + gap * (len(agents) - 1)),
                        subplot_titles=[f"<b style='color:{colors[a]}'>{heads[a]}</b>" for a in agents])
    top = max(float(df["density"].max()) if len(df) else 0.0, 1e-9)
    for i, a in enumerate(agents, start=1):
        part = df[df["agent"] == a]
        dens = part.pivot(index="layer", columns="column", values="density").reindex(index=layers, columns=columns)
        changed = part.pivot(index="layer", columns="column", values="changed").reindex(index=layers, columns=columns)
        z = (100 * dens).where(changed > 0)  # an untouched expert is blank, not the darkest colour
        hover = [[f"{label(a)} · layer {lay} · {_column_words(c)}: "
                  + ("unchanged" if not (changed.loc[lay, c] > 0) else
                     f"{100 * dens.loc[lay, c]:.3g}% changed ({int(changed.loc[lay, c]):,} elements)")
                  for c in columns] for lay in layers]
        fig.add_trace(go.Heatmap(z=z.values, x=[_column_text(c) for c in columns], y=_layer_ticks(layers),
                                 coloraxis="coloraxis", customdata=hover, xgap=1, ygap=1,
                                 hovertemplate="%{customdata}<extra></extra>"), row=i, col=1)
        fig.update_yaxes(title_text="layer", type="category", autorange="reversed", row=i, col=1)
        fig.update_xaxes(type="category", row=i, col=1)
    fig.update_xaxes(title_text="routed expert (index) · shared expert · router", row=len(agents), col=1)
    room_for_subplot_titles(fig)
    fig.update_layout(coloraxis=dict(colorscale="Viridis", cmin=0.0, cmax=100 * top,
                                     colorbar=dict(title=dict(text="changed (%)", side="top"), thickness=12,
                                                   len=min(1.0, 320 / (per * len(agents))), y=1, yanchor="top")))
    return chart_layout(fig, height=70 + per * len(agents) + gap * (len(agents) - 1), legend=False,
                   margin=fig.layout.margin)


def _column_text(c: str) -> str:
    """An MoE column's tick: the expert's index, "shared", "router" (hover texts say "expert 3")."""
    return c


def _column_words(c: str) -> str:
    return f"expert {c}" if c.isdigit() else ("shared expert" if c == "shared" else c)


def expert_owner_map(df, agents: list[str]) -> go.Figure:
    """Per layer × routed expert: which agents changed it — one agent's colour where only it did, greys (darker
    = more agents) where several did, blank where none did (the experts routing never gave them)."""
    colors, names = agent_colors(agents), agent_names(agents)
    n = len(agents)
    experts = expert_columns(df["expert"])
    layers = sorted(set(int(v) for v in df["layer"]))
    palette = [colors[a] for a in agents] + SHARED_GREYS[:max(0, n - 1)]
    code, hover = {}, {}
    flags = df[[f"changed:{a}" for a in agents]].to_numpy(dtype=bool)
    for layer, expert, row in zip(df["layer"], df["expert"], flags):
        who = [a for a, flag in zip(agents, row) if flag]
        key = (int(layer), str(expert))
        code[key] = None if not who else (agents.index(who[0]) + 1 if len(who) == 1 else n + len(who) - 1)
        hover[key] = f"layer {int(layer)} · {_column_words(str(expert))}: " + (
            "changed by " + ", ".join(label(a) for a in who) if who else "no agent changed it")
    z = [[code.get((lay, e)) for e in experts] for lay in layers]
    text = [[hover.get((lay, e), "") for e in experts] for lay in layers]
    k = len(palette)
    scale = []
    for i, c in enumerate(palette):  # one flat band per code 1..k
        scale += [[i / k, c], [(i + 1) / k, c]]
    fig = go.Figure(go.Heatmap(z=z, x=[_column_text(e) for e in experts], y=_layer_ticks(layers), zmin=0.5,
                               zmax=k + 0.5, colorscale=scale, showscale=False, customdata=text, xgap=1, ygap=1,
                               hovertemplate="%{customdata}<extra></extra>"))
    for a in agents:  # legend keys: the heatmap's colours named
        fig.add_scatter(x=[None], y=[None], mode="markers", marker=dict(symbol="square", size=12, color=colors[a]),
                        name=f"only {names[a]}")
    for m in range(2, n + 1):
        fig.add_scatter(x=[None], y=[None], mode="markers", marker=dict(symbol="square", size=12,
                                                                        color=palette[n + m - 2]),
                        name="all agents" if m == n else f"{m} agents")
    fig.add_scatter(x=[None], y=[None], mode="markers", name="none (blank)",
                    marker=dict(symbol="square-open", size=12, color=NEUTRAL))
    fig.update_yaxes(title="layer", type="category", autorange="reversed")
    fig.update_xaxes(title="routed expert (index)", type="category")
    # taller with more agents: in a narrow column its 2n keys stand above the map, a row each
    return chart_layout(fig, height=max(220, 16 * len(layers) + 120, 40 * n))

"""The Heterogeneity page's "Is the overlap real?" figures: agreement of each pair of agents on the elements both
changed (sign and cosine, against chance), where each agent's update energy lies, and where agreement concentrates."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.names import in_module_order

from .base import (
    NEUTRAL,
    UNIQUE_COLOR,
    agent_axis,
    agent_ticks,
    chart_layout,
    label,
    labels,
    room_for_subplot_titles,
    short_labels,
)
from .layout import panels


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


PAIR_LINES_UP_TO = 6  # pairs drawn as lines or bars; more (5 agents and up): each agent against the others
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"]


def agreement_by_group(df: pd.DataFrame, agents: list[str], by: str) -> go.Figure:
    """Per pair of agents, sign agreement (chance 50 %) and cosine (chance 0) per layer (lines) or module kind
    (bars): where agreement concentrates. Beyond PAIR_LINES_UP_TO pairs, heatmaps of each agent against the others."""
    pairs = list(dict.fromkeys(zip(df["a"], df["b"])))
    if len(pairs) > PAIR_LINES_UP_TO:
        return _agreement_heatmaps(df, agents, by, pairs)
    short = short_labels(agents)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=["same sign (%) · chance 50 %", "cosine · chance 0"])
    for k, (a, b) in enumerate(pairs):
        part = df[(df["a"] == a) & (df["b"] == b)]
        name = label(f"{short[a]} – {short[b]}")
        xs = _group_ticks(part, by)
        hover = [f"{label(a)} – {label(b)} · {label(by)} {label(x)}: %{{y:.3g}} ({int(n):,} elements both "
                 f"changed)" for x, n in zip(xs, part["both_changed"])]
        for col, value, scale in ((1, "sign_agreement", 100.0), (2, "cosine", 1.0)):
            kw = dict(x=xs, y=scale * part[value], name=name, legendgroup=name, showlegend=col == 1,
                      hovertext=hover, hovertemplate="%{hovertext}<extra></extra>")
            if by == "layer":
                fig.add_scatter(mode="lines+markers", line=dict(color=PALETTE[k % len(PALETTE)], width=2.5),
                                row=1, col=col, **kw)
            else:
                fig.add_bar(marker_color=PALETTE[k % len(PALETTE)], row=1, col=col, **kw)
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
    return panels(fig, 280)


def _group_ticks(part: pd.DataFrame, by: str) -> list[str]:
    return [("emb/head" if v == -1 else str(v)) if by == "layer" else str(v) for v in part[by]]


def _agreement_heatmaps(df: pd.DataFrame, agents: list[str], by: str, pairs: list) -> go.Figure:
    """Many pairs: one row per agent, one column per layer or module kind, each cell the mean over the agent's
    pairs (weighted by the elements both changed) of sign agreement (top) and cosine (bottom), coloured from
    chance (blue above, red below); one panel under the other."""
    short = short_labels(agents)
    d = df.assign(_g=_group_ticks(df, by), _w=df["both_changed"].astype(float))
    both = pd.concat([d.assign(agent=d["a"]), d.assign(agent=d["b"])])  # each pair counts for both its agents
    groups = (list(dict.fromkeys(d["_g"])) if by == "layer" else
              [m for m in in_module_order(df["module"]) if m in set(d["_g"])])
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=[f"same sign with the other {len(agents) - 1} agents (%) · chance 50 %",
                                        f"cosine with the other {len(agents) - 1} agents · chance 0"])
    for col, value, scale, (lo, hi), unit in ((1, "sign_agreement", 100.0, (30.0, 70.0), "%"),
                                              (2, "cosine", 1.0, (-0.4, 0.4), "")):
        part = both[both[value].notna() & (both["_w"] > 0)]
        mean = (part.assign(_x=scale * part[value] * part["_w"]).groupby(["agent", "_g"])[["_x", "_w"]].sum()
                .pipe(lambda g: g["_x"] / g["_w"]).unstack("_g").reindex(index=agents, columns=groups))
        fig.add_trace(go.Heatmap(z=mean.values, x=labels(groups), y=[short[a] for a in agents], colorscale="RdBu",
                                 zmid=(lo + hi) / 2, zmin=lo, zmax=hi, xgap=1, ygap=1,
                                 colorbar=dict(title=dict(text=unit or "cos", side="right"), thickness=10),
                                 customdata=[[f"{label(a)} · {label(by)} {label(g)}" for g in groups] for a in agents],
                                 hovertemplate=f"%{{customdata}}: %{{z:.3g}}{unit} (mean over its pairs, weighted by "
                                               "the elements both changed)<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="layer" if by == "layer" else "module kind", type="category", row=1, col=col)
        fig.update_yaxes(type="category", autorange="reversed", row=1, col=col)
    chart_layout(fig, height=150 + 24 * len(agents), legend=False)
    room_for_subplot_titles(fig)
    return panels(fig, 100_000)  # always one panel under the other: the agents' names take the width

"""The Tune page's figures: λ(ρ) with each agent's ρ_t, what each merge keeps of the unique updates, settings A | B."""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from merging.methods import regions

from .base import (
    LAMBDA_FLOOR,
    NEUTRAL,
    agent_axis,
    agent_colors,
    agent_names,
    agent_ticks,
    chart_layout,
    decades,
    error_bars,
    label,
    labels,
    lambda_top,
    log_ticks,
    room_for_subplot_titles,
    tick_label,
)


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
    if rule == "clip" and alpha > 0:  # the label placed by hand: on a log axis an annotation's x is log10(x)
        fig.add_vline(x=alpha, line=dict(dash="dot", color=NEUTRAL))
        fig.add_annotation(x=math.log10(alpha) if log else alpha, xref="x", y=0, yref="paper", yanchor="bottom",
                           xanchor="left", text=f"α = {alpha:g}", showarrow=False, xshift=4, yshift=4)
    for _, row in lam.iterrows():
        inf = not math.isfinite(row["rho"])
        zero = row["rho"] <= 0
        x = hi if inf else (xs[0] if (zero and log) else row["rho"])
        rho_text = "∞" if inf else f"{row['rho']:.3g}"
        fig.add_scatter(x=[x], y=[row["lambda"]], mode="markers", name=names.get(row["agent"], label(row["agent"])),
                        marker=dict(color=colors.get(row["agent"], NEUTRAL), size=13,
                                    line=dict(color="white", width=1.5),
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
    return chart_layout(fig, height=340)


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
    fig.update_yaxes(title="unique update kept (% of the agent's)",
                     range=[0, max(140, 100 * df["retention"].max() + 20)])
    fig.update_xaxes(title="merge method")
    return chart_layout(fig, height=340)


def compare_bars(cmp: pd.DataFrame, agents: list[str]) -> go.Figure:
    """A | B: λ_t and the unique update RAM+ keeps (λ_t·‖τ_unique‖), per agent; B hatched."""
    colors = agent_colors(agents)
    d = cmp.set_index("agent").reindex(agents)
    xs, full = agent_ticks(agents), labels(agents)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=["λ_t (unique-update scale),<br>bars from 1",
                                        "unique update kept,<br>λ_t·‖τ_unique‖"])
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
    chart_layout(fig, height=380)
    room_for_subplot_titles(fig, 2)
    return fig


def measured_bars(df: pd.DataFrame, agents: list[str]) -> go.Figure:
    """Settings A and B measured: accuracy per task and on average, ± one standard error; B hatched. `df`: one
    row per task (and `average`) with columns task, A, A_se, B, B_se."""
    colors = {**agent_colors(agents), "average": NEUTRAL}
    tasks = list(df["task"])
    fig = go.Figure()
    for tag, pattern in (("A", ""), ("B", "/")):
        fig.add_bar(x=[tick_label(t) for t in tasks], y=df[tag], name=f"setting {tag}", offsetgroup=tag,
                    marker=dict(color=[colors.get(t, NEUTRAL) for t in tasks], pattern_shape=pattern,
                                pattern_fillmode="overlay", line=dict(color=NEUTRAL, width=1)),
                    error_y=error_bars(df[f"{tag}_se"]), customdata=list(zip(labels(tasks), df[f"{tag}_se"])),
                    hovertemplate=f"%{{customdata[0]}} · {tag}: %{{y:.2f}}% ± %{{customdata[1]:.2f}}<extra></extra>")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="accuracy (%, validation)", rangemode="tozero")
    fig.update_xaxes(title="task", type="category")
    return chart_layout(fig, height=320)

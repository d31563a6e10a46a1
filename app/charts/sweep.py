"""The Sweep page's figures and the short candidate names they use."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .base import AGENT_PALETTE, NEUTRAL, agent_colors, chart_layout, eps_label, error_bars, labels, tick_label

METHOD_SHORT = {"average": "avg", "task_arithmetic": "TA", "ties": "TIES", "dare_ta": "DARE-TA",
                "dare_ties": "DARE-TIES", "ram": "RAM", "ram_plus": "RAM+", "ram_plus_soft": "RAM+s",
                "unique_only": "unique", "fisher": "Fisher"}
PARAM_SHORT = {"lambda": "λ", "density": "d", "drop_rate": "p", "eps": "ε", "alpha": "α", "rho_scope": "ρ",
               "r": "r", "seed": "seed", "agent": "agent", "dilute": "÷N", "fisher_examples": "N",
               "fisher_rule": "answers", "fisher_floor": "floor"}


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


def _se(df: pd.DataFrame, col: str):
    """The `<col>_se` column of `df` (None when it has none)."""
    return df[f"{col}_se"] if f"{col}_se" in df.columns else None


def _pm_text(se) -> list[str]:
    return ["" if v is None or v != v else f" ± {v:.2f}" for v in se] if se is not None else []


def sweep_param_lines(df: pd.DataFrame, param: str, tasks: list[str], agents: list[str]) -> go.Figure:
    """The paper's Table 2 view: score against one swept parameter, one line per task and the average
    (dashed), ± one standard error as error bars where `df` has `<task>_se` / `average_se`; on the average,
    a filled marker is within noise of the method's chosen candidate (`within_noise`), an open one is not. `df`
    holds one method's candidates on one split, one row each, with `candidate` for hover."""
    colors = _task_colors(tasks, agents)
    d = df.sort_values(param, key=lambda s: s.map(lambda v: (0, v) if isinstance(v, (int, float)) else (1, str(v))))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in d[param])
    xs = list(d[param]) if numeric else [str(v) for v in d[param]]
    fig = go.Figure()
    for t in [*tasks, "average"]:
        se = _se(d, t)
        marker = None
        if t == "average" and "within_noise" in d.columns:
            marker = dict(size=9, symbol=["circle" if w else "circle-open" for w in d["within_noise"]],
                          line=dict(width=2, color=colors[t]))
        fig.add_scatter(x=xs, y=d[t], mode="lines+markers", name=short_text(t, 24),
                        line=dict(color=colors[t], width=3 if t == "average" else 2,
                                  dash="dash" if t == "average" else "solid"), marker=marker,
                        error_y=error_bars(se, colors[t]),
                        customdata=list(zip(d["candidate"], _pm_text(se) or [""] * len(d))),
                        hovertemplate=f"{t}: %{{y:.2f}}%%{{customdata[1]}}<br>%{{customdata[0]}}<extra></extra>")
    best = d.loc[d["average"].idxmax()] if len(d) else None
    if best is not None:
        x = best[param] if numeric else str(best[param])
        fig.add_scatter(x=[x], y=[best["average"]], mode="markers", name="best average",
                        marker=dict(symbol="star", size=16, color=NEUTRAL, line=dict(color="white", width=1)),
                        hovertemplate=f"best average: %{{y:.2f}}%<br>{best['candidate']}<extra></extra>")
    short = PARAM_SHORT.get(param, param)
    fig.update_xaxes(title=param if short == param else f"{param} ({short})", type="linear" if numeric else "category")
    fig.update_yaxes(title="accuracy (%)", rangemode="tozero")
    return chart_layout(fig, height=380)


def sweep_time_scatter(df: pd.DataFrame) -> go.Figure:
    """The paper's Fig. 9 view: each candidate's average score (± one standard error where `df` has
    `average_se`) against the seconds its merge took — for Fisher merging with its Fisher pass (column `fisher_s`,
    when present) — one colour per method (one row per candidate; `short` and `candidate` labels)."""
    fig = go.Figure()
    methods = list(dict.fromkeys(df["method"]))
    fisher = df["fisher_s"] if "fisher_s" in df else pd.Series(0.0, index=df.index)
    for i, m in enumerate(methods):
        part, extra = df[df["method"] == m], fisher[df["method"] == m]
        se = _se(part, "average")
        fig.add_scatter(x=part["merge_s"] + extra, y=part["average"], mode="markers",
                        name=METHOD_SHORT.get(m, short_text(m)),
                        marker=dict(size=11, color=AGENT_PALETTE[i % len(AGENT_PALETTE)],
                                    line=dict(color="white", width=1),
                                    symbol=["star" if s else "circle" for s in part["selected"]]),
                        error_y=error_bars(se, AGENT_PALETTE[i % len(AGENT_PALETTE)]),
                        customdata=list(zip(part["candidate"], extra, _pm_text(se) or [""] * len(part))),
                        hovertemplate="%{customdata[0]}<br>%{x:.3f} s (Fisher pass %{customdata[1]:.1f} s) · average "
                                      "%{y:.2f}%%{customdata[2]}<extra></extra>")
    fig.update_xaxes(title="merge time (s, in memory; Fisher merging with its Fisher pass)", rangemode="tozero")
    fig.update_yaxes(title="average accuracy (%)")
    return chart_layout(fig, height=360)


def sweep_task_bars(df: pd.DataFrame, tasks: list[str], agents: list[str]) -> go.Figure:
    """The chosen candidates next to the base and the agents: one group per model (short label, full name on
    hover), one bar per task and the average, ± one standard error where `df` has `<task>_se` / `average_se`;
    `df` has columns name, short, and the tasks."""
    colors = _task_colors(tasks, agents)
    fig = go.Figure()
    for t in [*tasks, "average"]:
        se = _se(df, t)
        fig.add_bar(x=[tick_label(v) for v in df["short"]], y=df[t], name=short_text(t, 24), marker_color=colors[t],
                    error_y=error_bars(se), customdata=list(zip(labels(df["name"]), _pm_text(se) or [""] * len(df))),
                    hovertemplate=f"%{{customdata[0]}}<br>{t}: %{{y:.2f}}%%{{customdata[1]}}<extra></extra>")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="accuracy (%)", rangemode="tozero")
    fig.update_xaxes(title="model", type="category")
    return chart_layout(fig, height=400)

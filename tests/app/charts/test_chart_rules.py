"""The chart rules on the figures themselves (the rendered geometry is in tests/browser/test_chart_layout.py): λ in
its own units on axes from 1, the log switch for ρ only and log axes labelled at decades, one module order in every
chart, short agent names with the full names on hover for 2–8 agents."""
from __future__ import annotations

import html
import json
import re

import plotly.graph_objects as go
import pytest

from analysis import tables
from analysis.names import MODULE_ORDER, in_module_order
from app import charts
from app.charts.base import log_or_linear as log_or_linear
from tests.chart_cases import EPS, LONG_NAMES, cases, long_named_result

MODEL_ORDER = ["embeddings", "q", "k", "v", "o", "gate", "up", "down", "norm", "lm_head"]


@pytest.fixture(scope="module")
def res3(tmp_path_factory):
    return long_named_result(tmp_path_factory.mktemp("three"), 3)


@pytest.fixture(scope="module")
def res8(tmp_path_factory):
    return long_named_result(tmp_path_factory.mktemp("eight"), 8)


def test_module_order_is_the_models_everywhere(res3):
    assert [m for m in MODULE_ORDER if m in MODEL_ORDER] == MODEL_ORDER  # extended, not reordered:
    o, gate = MODULE_ORDER.index("o"), MODULE_ORDER.index("gate")  # the MoE block after the attention block
    assert (o < MODULE_ORDER.index("router") < MODULE_ORDER.index("expert gate")
            < MODULE_ORDER.index("shared gate") < gate)
    assert in_module_order(["v", "lm_head", "q", "norm", "embeddings", "down", "zz", "o"]) == \
        ["embeddings", "q", "v", "o", "down", "norm", "lm_head", "zz"]
    for by in ("module", "layer × module"):
        t = tables.rho_lambda_by(res3, EPS, by, 0.1, 2.0)
        for _, part in t.groupby("agent", sort=False):
            mods = list(dict.fromkeys(part["module"].astype(str))) if by == "module" else None
            if mods:
                assert mods == [m for m in MODEL_ORDER if m in mods]
    ag = list(res3.agents)
    for value, frame in (("rho", tables.rho_lambda_by(res3, EPS, "layer × module", 0.1, 2.0)),
                         ("lambda", tables.rho_lambda_by(res3, EPS, "layer × module", 0.1, 2.0)),
                         ("density", tables.density_by_layer_module(res3, EPS))):
        # as the page passes it: the module column as plain strings (alphabetical if sorted naively)
        fig = charts.layer_module_heatmaps(frame.assign(module=frame["module"].astype(str)), ag, value, scale=1.0)
        assert list(fig.data[0].y) == [m for m in MODEL_ORDER if m in list(fig.data[0].y)], value
        assert list(fig.data[0].y)[0] == "embeddings" and list(fig.data[0].y)[-1] == "lm_head"
    for value in ("rho", "lambda"):
        fig = charts.group_lines(tables.rho_lambda_by(res3, EPS, "module", 0.1, 2.0), ag, "module", value, value,
                                 True, value)
        assert list(fig.layout.xaxis.categoryarray) == MODEL_ORDER
        assert [list(t.x) for t in fig.data] == [MODEL_ORDER] * len(ag)


def test_lambda_is_linear_from_one_and_log_is_for_rho_only(res3):
    ag = list(res3.agents)
    by_layer = tables.rho_lambda_by(res3, EPS, "layer", 0.1, 2.0)
    lam_line = charts.group_lines(by_layer, ag, "layer", "lambda", "λ", True, "λ")  # log asked: ignored for λ
    assert lam_line.layout.yaxis.type in (None, "linear", "-")
    lo, hi = lam_line.layout.yaxis.range
    assert lo == 1.0 and max(by_layer["lambda"]) < hi < 1.1 * max(by_layer["lambda"]) + 0.05
    rho_line = charts.group_lines(by_layer, ag, "layer", "rho", "ρ", True, "ρ")
    assert rho_line.layout.yaxis.type == "log"
    # λ heatmap: a linear colour scale from 1, in λ's own units (not log10: 0.04–0.07 for λ 1.1–1.2)
    lm = tables.rho_lambda_by(res3, EPS, "layer × module", 0.1, 2.0, "clip", "tensor")
    heat = charts.layer_module_heatmaps(lm, ag, "lambda", log=True, colorbar="λ", scale=1.0)
    assert heat.layout.coloraxis.cmin == 1.0 and heat.layout.coloraxis.cmax == pytest.approx(lm["lambda"].max())
    zs = [v for t in heat.data for row in t.z for v in row if v is not None and v == v]
    assert min(zs) >= 1.0 and max(zs) == pytest.approx(lm["lambda"].max())
    assert "log" not in heat.layout.coloraxis.colorbar.title.text
    # ρ heatmap on a log colour scale, labelled at decades in ρ's own units
    rho_heat = charts.layer_module_heatmaps(lm, ag, "rho", log=True, colorbar="ρ", scale=1.0)
    bar = rho_heat.layout.coloraxis.colorbar
    assert list(bar.ticktext) == [charts.decade_text(int(v)) for v in bar.tickvals]
    assert all(float(t) in (0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0) for t in bar.ticktext)
    # λ(ρ): the λ axis starts at 1; A | B's λ bars grow from 1
    lam = tables.lambda_table(res3, EPS, 0.1, 2.0)
    curve = charts.lambda_curve(lam, ag, 0.1, 2.0, "clip", True)
    top = 1 + 0.1 * 2.0  # the clip rule's ceiling 1 + r·α, and room for a marker above it
    assert curve.layout.yaxis.range[0] == 1.0 and top < curve.layout.yaxis.range[1] <= top + 0.03
    a = {"eps": EPS, "r": 0.1, "alpha": 2.0, "rule": "clip", "rho_scope": "global"}
    cmp = tables.compare_settings(res3, a, {**a, "r": 0.01})
    ab = charts.compare_bars(cmp, ag)
    lam_bars = [t for t in ab.data if t.xaxis == "x"]
    assert all(t.base == 1.0 for t in lam_bars) and ab.layout.yaxis.range[0] == 1.0
    for t, tag in zip(lam_bars, "AB"):
        assert [1.0 + y for y in t.y] == pytest.approx(list(cmp[f"lambda_{tag}"]))
        assert [c[1] for c in t.customdata] == pytest.approx(list(cmp[f"lambda_{tag}"]))  # hover: λ itself


@pytest.mark.parametrize("values, lo, hi", [([0.3, 0.8], -1, 0), ([1.1, 1.2], 0, 1), ([0.004, 45.0], -3, 2),
                                             ([10.0], 1, 2)])
def test_log_axes_label_decades_only(values, lo, hi):
    assert charts.decades(values) == (lo, hi)
    fig = go.Figure(go.Bar(x=["a"] * len(values), y=values))
    log_or_linear(fig, True, values, "share")
    ax = fig.layout.yaxis
    assert ax.type == "log" and ax.tickmode == "array"
    assert list(ax.tickvals) == [10.0 ** k for k in range(lo, hi + 1)]  # 0.1, 1, 10 … never 2 or 5
    assert all(re.fullmatch(r"(1e-?\d+|0\.0*1|10*)", t) for t in ax.ticktext), ax.ticktext


@pytest.mark.parametrize("n", [2, 3, 8])
def test_every_chart_uses_short_names_and_keeps_the_full_ones_on_hover(tmp_path, n):
    res = long_named_result(tmp_path, n)
    full = list(res.agents)
    assert full == LONG_NAMES[:n]
    short = charts.short_labels(full)
    assert len(set(short.values())) == n and all(len(v) <= 20 for v in short.values())
    for name, (fig, _title, _w) in cases(res).items():
        text = json.dumps(fig.to_plotly_json(), ensure_ascii=False)
        for tr in fig.data:
            for v in list(tr.x if tr.x is not None else []) + list(tr.y if tr.y is not None else []):
                if isinstance(v, str):
                    assert all(len(html.unescape(line)) <= 20 for line in v.split("<br>")), (name, v)
                    assert not any(f in v for f in full if len(f) > 20), (name, v)
            if tr.showlegend is not False and tr.name:
                assert not any(f in tr.name for f in full if len(f) > 20), (name, tr.name)
        if fig.layout.showlegend is not False and any(t.showlegend is not False and t.name for t in fig.data):
            assert fig.layout.legend.x >= 1 and fig.layout.legend.orientation == "v", name  # beside the plot
        if name not in ("table1", "reward_curves") and any(s in text for s in short.values()):
            assert all(f in text for f in full), (name, "full names on hover")
        if n > charts.WRAP_UP_TO and fig.layout.xaxis.type == "category" and \
                any(isinstance(v, str) and v.replace("<br>",
                                                     "") in short.values() for t in fig.data for v in (t.x or [])):
            assert fig.layout.xaxis.tickangle == -45, name  # many agents: one line each, tilted 45°, never 90°


def test_titles_and_subtitles_wrap_to_the_chart_width():
    fig = charts.styled(go.Figure(), "Update size by region, and sign conflicts, with a longer title than fits",
                        charts.subtitle_of({"eps": 1e-5, "agents": LONG_NAMES}), kind="light", width=0.5)
    lines = fig.layout.title.text.split("<br>")
    plain = [re.sub(r"<[^>]+>", "", line) for line in lines]
    px = charts.PAGE_WIDTH * 0.5 - 30
    assert len(lines) >= 3
    assert all(len(t) * charts.SUBTITLE_PX <= px for t in plain)
    assert not any(f in fig.layout.title.text for f in LONG_NAMES if len(f) > 20)  # agents by their short names
    assert fig.layout.margin.t >= 38 + 21 * (len(lines) - 1)  # the band holds every line


# ---------------------------------------------------------------- tables (point 9)

def test_tables_fit_their_labels_and_show_the_end_of_long_paths():
    import pandas as pd

    from app.tables import MAX_PX, fitted_columns, path_end

    long = "/data/checkpoints/qwen/runs/2026-11-24/Qwen2.5-7B-Instruct-ToolRL-grpo-cold"
    assert path_end(long, 40).endswith("Qwen2.5-7B-Instruct-ToolRL-grpo-cold") and path_end(long, 40).startswith("…")
    assert len(path_end(long, 40)) <= 40 and path_end("short/path", 40) == "short/path"
    assert path_end(long, 40) == "…/Qwen2.5-7B-Instruct-ToolRL-grpo-cold"  # cut at a separator: the name whole
    assert path_end("a\x1b[31mb" + "x" * 80, 20).endswith("x" * 19)  # escaped like every name
    df = pd.DataFrame({"model": ["base", "ram_plus (this session)", "task arithmetic (this session)"],
                       "code": [1.0, 2.0, 3.0]}).set_index("model")
    df["note"] = ["", "stored", "a"]
    cfg = fitted_columns(df, index=True)
    assert "code" not in cfg  # a number column with a short header keeps Streamlit's width
    assert fitted_columns(pd.DataFrame({"chance (independent masks)": [0.5]}))["chance (independent masks)"][
        "width"] >= 28 + 7.5 * len("chance (independent masks)")
    need = 28 + 7.5 * len("task arithmetic (this session)")
    assert cfg["_index"]["width"] >= need and cfg["note"]["width"] >= 28 + 7.5 * len("stored")
    huge = pd.DataFrame({"x": ["y" * 500]})
    assert fitted_columns(huge)["x"]["width"] == MAX_PX

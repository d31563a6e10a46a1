"""The one layout rule (app/charts/layout.py) on figures, without a browser: what it decides for a width —
panels side by side or stacked, the legend beside the plot or above it, tick labels level, on two lines or
tilted, value labels at a readable size or left to the hover — and the pairs of charts a page stacks when the
measured width is narrow (app/viewport.py). The rendered result is measured in chromium by
tests/browser/test_chart_layout.py."""
from __future__ import annotations

import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

from app import charts
from app.charts import layout


def bars(names: list[str], legend: list[str] | None = None, text: bool = True) -> go.Figure:
    fig = go.Figure()
    for k, trace in enumerate(legend or ["only"]):
        fig.add_bar(x=names, y=[10.0 + i + k for i in range(len(names))], name=trace,
                    text=[f"{10.0 + i:.1f}%" for i in range(len(names))] if text else None, textposition="outside")
    fig.update_xaxes(type="category")
    return charts.base.chart_layout(fig, legend=legend is not None)


def test_tick_labels_are_level_then_on_two_lines_then_tilted():
    names = ["ReasonFlux-Coder", "Qwen2.5…grpo-cold", "RL-MemoryAgent"]
    assert layout.tick_plan(names, 200)[1] == 0 and "<br>" not in "".join(layout.tick_plan(names, 200)[0])
    two, angle, _ = layout.tick_plan(names, 100)
    assert angle == 0 and all("<br>" in t for t in two)
    assert layout.tick_plan(names, 40)[1] == -45 and layout.tick_plan(names, 12)[1] == -90
    # a label with words breaks between words, never inside a number such as 1e-5
    sweep = "RAM+ ε=1e-5 r=0.2 α=2"
    two, angle, _ = layout.tick_plan([sweep], layout.text_px(sweep) * 0.75)
    assert angle == 0 and two[0] in ("RAM+ ε=1e-5<br>r=0.2 α=2", "RAM+<br>ε=1e-5 r=0.2 α=2")


@pytest.mark.parametrize("width, where", [(1460, "right"), (320, "top")])
def test_the_legend_stands_beside_a_wide_plot_and_above_a_narrow_one(width, where):
    names = ["ReasonFlux-Coder", "Qwen2.5…grpo-cold", "RL-MemoryAgent"]
    fig = charts.styled(bars(names, ["measured", "chance (independent masks)"]), "A title", "a subtitle",
                        kind="light", px=width)
    lg = fig.layout.legend
    if where == "right":
        assert lg.x >= 1 and lg.xanchor == "left" and lg.orientation == "v"
    else:  # in a band of its own between the title and the plot: the top margin holds title, band and legend
        assert lg.orientation == "h" and lg.yref == "container" and lg.yanchor == "top"
        assert (1 - lg.y) * fig.layout.height < fig.layout.margin.t - layout.LEGEND_LINE_PX
        assert lg.maxheight >= layout.LEGEND_LINE_PX  # room for every row: it never scrolls


def test_panels_stack_when_narrow_and_stand_side_by_side_when_wide():
    def two_panels() -> go.Figure:
        fig = make_subplots(rows=1, cols=2, subplot_titles=["left panel", "right panel"])
        fig.add_bar(x=["a", "b"], y=[1, 2], row=1, col=1)
        fig.add_bar(x=["a", "b"], y=[3, 4], row=1, col=2)
        fig.update_yaxes(title_text="a value", row=1, col=2)
        charts.base.room_for_subplot_titles(fig)
        return layout.panels(charts.base.chart_layout(fig, legend=False), 260)

    wide = charts.styled(two_panels(), "t", kind="light", px=1460)
    assert wide.layout.xaxis.domain[1] < wide.layout.xaxis2.domain[0]  # side by side, a gap between
    assert tuple(wide.layout.yaxis.domain) == tuple(wide.layout.yaxis2.domain)
    narrow = charts.styled(two_panels(), "t", kind="light", px=530)
    assert tuple(narrow.layout.xaxis.domain) == tuple(narrow.layout.xaxis2.domain)  # one under the other
    assert narrow.layout.yaxis2.domain[1] < narrow.layout.yaxis.domain[0]
    assert narrow.layout.height > wide.layout.height
    titles = {a.text: (a.x, a.y) for a in narrow.layout.annotations if a.name == "subplot-title"}
    assert titles["left panel"][1] > titles["right panel"][1]  # each title moved with its panel


def test_value_labels_are_readable_or_left_to_the_hover():
    names = [f"agent-{i}" for i in range(8)]
    roomy = charts.styled(bars(names), "t", kind="light", px=1460)
    assert all(t.textfont.size >= layout.MIN_FONT for t in roomy.data) and roomy.data[0].text is not None
    cramped = charts.styled(bars(names, ["a", "b", "c", "d", "e", "f"]), "t", kind="light", px=300)
    assert all(t.text is None for t in cramped.data)  # no label squeezed under MIN_FONT px
    assert cramped.layout.uniformtext.minsize == layout.MIN_FONT


def test_text_widths_are_upper_estimates():
    assert layout.text_px("ReasonFlux-<br>Coder-7B") == layout.text_px("ReasonFlux-")
    assert layout.text_px("a &amp; b") == layout.text_px("a & b")  # entities are the characters they show
    assert layout.text_px("<b>bold</b>") == layout.text_px("bold")  # tags take no room
    assert layout.text_px("MMMM") > layout.text_px("iiii")


def test_pairs_of_charts_stack_when_the_measured_column_is_narrow():
    from streamlit.testing.v1 import AppTest

    def page():
        import streamlit as st

        from app import charts

        places, share = charts.pair()
        st.write(f"{len(places)} places, share {share}")

    for content, columns in ((530, 0), (810, 0), (930, 2), (1450, 2)):  # 1000, 1280, 1400, 1920 px windows
        at = AppTest.from_function(page)
        at.session_state["_content_px"] = content
        at.run()
        assert len(at.columns) == columns, (content, at.markdown[0].value)
    at = AppTest.from_function(page).run()  # not measured (no browser): the narrowest layout, stacked
    assert len(at.columns) == 0

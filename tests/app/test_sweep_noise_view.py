"""AppTest of what the Sweep page shows of the noise: error bars equal to the sweep's standard errors on its
charts, averages ± s.e. in the chosen table, grid-edge warnings with the next values, the pairwise comparisons of
the chosen candidates — checked against the same sweep run in-process from the score store."""
from __future__ import annotations

import time

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from tests.app_helpers import APP_MAIN, app_env, figure, reload_hub_client

pytestmark = pytest.mark.timeout(600)
GRIDS = ["task_arithmetic lambda=0.5,1.0", "ram"]
LIMIT = 12


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("apptest-sweep-noise")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**app_env(tmp, use_real_demo=True), "RAM_STUDIO_SWEEP_CACHE": str(tmp / "sweeps")}.items():
            mp.setenv(k, v)
        reload_hub_client()
        st.cache_resource.clear()
        yield tmp
    reload_hub_client()
    st.cache_resource.clear()


def test_the_sweep_page_shows_the_noise(env):
    at = AppTest.from_file(str(APP_MAIN), default_timeout=120)
    at.run()
    at.switch_page("views/sweep.py").run()
    for text in GRIDS:
        method, *rest = text.split()
        at.selectbox(key="sweep_method").set_value(method).run()
        for word in rest:
            name, values = word.split("=")
            at.text_input(key=f"sweep_{method}_{name}").set_value(values).run()
        at.button(key="sweep_add").click().run()
    at.multiselect(key="sweep_tasks").set_value(["code", "memory"]).run()
    at.number_input(key="sweep_limit").set_value(LIMIT).run()
    at.button(key="sweep_start").click().run()
    deadline = time.time() + 500
    while at.button(key="sweep_start").disabled and time.time() < deadline:
        time.sleep(0.5)
        at.run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]

    from app import state
    from demo.evaluator import DemoEvaluator
    from evaluation.executors import run_local

    # the same sweep (the page's models, in its order) from the store the page filled: every score comes back
    sel = state.demo_selection()
    res = run_local(sel.base, list(sel.agents), GRIDS, DemoEvaluator(["code", "memory"]), LIMIT)
    assert all(e.resumed for e in res.entries)
    valid = {e.label: e for e in res.candidates("validation")}
    ta = sorted((e for e in valid.values() if e.method == "task_arithmetic"), key=lambda e: e.params["lambda"])

    at.selectbox(key="sweep_line_pick").set_value(("task_arithmetic", "lambda")).run()
    lines = {t.name: t for t in figure(at, "chart_sweep_param").data}
    assert list(lines["average"].error_y.array) == pytest.approx([e.average_stderr for e in ta])
    assert list(lines["code"].error_y.array) == pytest.approx([e.stderr["code"] for e in ta])
    assert list(lines["average"].marker.symbol) == ["circle" if e.within_noise_method else "circle-open" for e in ta]
    bars = {t.name: t for t in figure(at, "chart_sweep_chosen").data}
    report = res.candidates("test") + res.references()
    assert list(bars["memory"].error_y.array) == pytest.approx([e.stderr["memory"] for e in report])
    scatter = figure(at, "chart_sweep_time")
    assert all(t.error_y.array is not None and len(t.error_y.array) == len(t.x) for t in scatter.data)

    chosen = at.dataframe[1].value
    for m, c in res.selected.items():
        row = chosen[chosen["method"] == m].iloc[0]
        assert row["validation average"].startswith(f"{valid[c.label].average:.2f} ± "
                                                    f"{valid[c.label].average_stderr:.2f}")
        assert row["grid edge"] == ", ".join(valid[c.label].grid_edge)
    warnings = [w.value for w in at.warning]
    for e in valid.values():
        if e.selected and e.grid_edge:
            assert any(w.startswith(f"{e.method}: the chosen") for w in warnings), warnings
    (c,) = res.comparisons
    table = at.dataframe[2].value
    assert list(table["a − b"]) == [f"{c['diff']:.2f} ± {c['stderr']:.2f}"]
    assert list(table["verdict"]) == ["a beats b" if c["beyond_noise"] and c["diff"] > 0 else
                                      "b beats a" if c["beyond_noise"] else "within noise"]

    # the overlap reading of these same models now cites this session's sweep (its test split), not the weights
    at.switch_page("views/heterogeneity.py").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    from analysis.noise import plus_minus

    ta, ram = (next(e for e in report if e.kind == "candidate" and e.method == m) for m in ("task_arithmetic", "ram"))
    boxes = [b.value.replace("\\", "") for b in [*at.warning, *at.success, *at.info]
             if "Measured on these models" in b.value]  # Markdown escapes dropped
    assert len(boxes) == 1 and "this session's sweep, test split" in boxes[0]
    assert plus_minus(ram.average - ta.average, c["stderr"], signed=True) in boxes[0] or \
        f"{abs(ram.average - ta.average):.1f} ± {c['stderr']:.1f}" in boxes[0]

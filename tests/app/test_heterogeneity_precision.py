"""The Heterogeneity page's precision view (Streamlit AppTest): next to ε, where ε sits against one representable
step of the stored dtype and each agent's stored-value changes and one-step changes, the same numbers as
analysis.tables.precision_view; every chance level in the overlap table and defined on the page."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.app_helpers import APP_MAIN, plain

pytestmark = pytest.mark.timeout(300)


def test_the_precision_view_sits_next_to_eps(env):
    from analysis.stats import analyze
    from analysis.tables import precision_view

    at = AppTest.from_file(str(APP_MAIN), default_timeout=180).run()
    assert not at.exception and at.title[0].value == "Heterogeneity"
    for eps in (1e-5, 1e-3):
        at.select_slider(key="het_eps").set_value(eps).run()
        assert not at.exception
        text = " ".join(plain(m.value) for m in at.markdown)
        res = analyze("demo:base", ["demo:code", "demo:tool", "demo:memory"])
        pv = precision_view(res, eps)
        share = 100 * pv["eps_below_step_share"][0]
        assert f"is below one representable step of the stored dtype for **{share:.1f} %**" in text
        table = next(d.value for d in at.dataframe if "one-step Σ τ²" in d.value.columns)
        assert list(table.columns) == ["agent", "density", "at ε = 0", "one step", "one-step Σ τ²"]
        assert len(table) == 3
        overlap = next(d.value for d in at.dataframe if "chance (tensor × binade)" in d.value.columns)
        assert {"chance (model)", "chance (per tensor)"} <= set(overlap.columns)
    captions = " ".join(plain(c.value) for c in at.caption)
    for level in ("whole model", "per tensor", "per tensor × binade"):
        assert level in captions

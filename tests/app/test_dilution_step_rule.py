"""The Signal dilution page cites each demo trio's step-rule Table 1 from its results files (Streamlit AppTest on
the committed demo): the rule validation chose for RAM / RAM+, their test averages ± s.e. next to the paper's ε,
and each paired difference as the comparisons file has it — read from the CSV files, not written into the page."""
from __future__ import annotations

import pandas as pd
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from demo import table1_step_rule as step
from tests.app_helpers import (
    APP_MAIN,
    app_env,
    plain,
    real_demo_complete,
    reload_hub_client,
)

pytestmark = pytest.mark.timeout(600)
RESULTS = {"demo:": step.DEMO_DIR / "results", "demo-shared:": step.DEMO_DIR / "results-shared"}


@pytest.mark.skipif(not real_demo_complete(), reason="the committed demo models are not here")
def test_each_trio_cites_its_step_rule_table(tmp_path):
    with pytest.MonkeyPatch.context() as mp:
        for k, v in app_env(tmp_path, use_real_demo=True).items():
            mp.setenv(k, v)
        reload_hub_client()
        st.cache_resource.clear()
        try:
            at = AppTest.from_file(str(APP_MAIN), default_timeout=400).run()
            at.switch_page("views/dilution.py").run()
            assert not at.exception
            captions = [plain(c.value) for c in at.caption]
        finally:
            reload_hub_client()
            st.cache_resource.clear()
    cited = [c for c in captions if c.startswith("With ε in representable steps of bf16")]
    assert len(cited) == len(RESULTS)
    for text, results in zip(cited, RESULTS.values()):
        table = pd.read_csv(results / f"{step.NAME}.csv").set_index("model")
        pairs = pd.read_csv(results / f"{step.NAME}_comparisons.csv")
        for method in step.RULED:
            assert f"{table.loc[method, 'avg']:.2f} ± {table.loc[method, 'avg_se']:.2f}" in text
            paper = step.PAPER.format(method)
            if paper in table.index:
                assert f"{table.loc[paper, 'avg']:.2f} ± {table.loc[paper, 'avg_se']:.2f}" in text
                (r,) = pairs[(pairs.a == method) & (pairs.b == paper)].itertuples()
                assert f"{abs(r.diff):.2f} ± {r.stderr:.2f}" in text

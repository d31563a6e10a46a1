"""The app never runs a model folder's own Python either: a Sweep on models whose config needs their own code
(an unknown model_type with an auto_map) ends with one clear error on the page, and the code never ran."""
from __future__ import annotations

import time

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from tests.app_helpers import APP_MAIN, app_env, plain, reload_hub_client
from tests.cli.test_custom_code import custom_code_folder

pytestmark = pytest.mark.timeout(300)


@pytest.fixture()
def env(tmp_path):
    with pytest.MonkeyPatch.context() as mp:
        for k, v in app_env(tmp_path, use_real_demo=True).items():
            mp.setenv(k, v)
        reload_hub_client()
        st.cache_resource.clear()
        yield tmp_path
    reload_hub_client()
    st.cache_resource.clear()


def test_a_sweep_on_custom_code_models_is_one_error_and_runs_nothing(env):
    folders = [custom_code_folder(env, model=m) for m in ("base", "code", "tool")]
    at = AppTest.from_file(str(APP_MAIN), default_timeout=120)
    at.query_params["base"] = str(folders[0])
    at.query_params["agent"] = [str(f) for f in folders[1:]]
    at.run()
    at.switch_page("views/sweep.py").run()
    at.selectbox(key="sweep_method").set_value("task_arithmetic").run()
    at.text_input(key="sweep_task_arithmetic_lambda").set_value("0.5").run()
    at.button(key="sweep_add").click().run()
    at.radio(key="sweep_evaluator").set_value("Demo tasks").run()
    at.multiselect(key="sweep_tasks").set_value(["code"]).run()
    at.number_input(key="sweep_limit").set_value(2).run()
    at.button(key="sweep_start").click().run()
    deadline, shown = time.time() + 240, []
    while time.time() < deadline and not shown:
        at.run()
        shown = [plain(e.value) for e in at.error]
        time.sleep(0.3)
    assert len(shown) == 1 and "own Python" in shown[0] and "never runs" in shown[0], shown
    assert not at.exception
    assert not any((f / "CODE_RAN").exists() for f in folders)

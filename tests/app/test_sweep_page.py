"""AppTest of the Sweep page (candidates from the declarations, background job with progress and cancel, results,
charts, "merge & export this candidate") and of Tune's measured A | B."""
from __future__ import annotations

import time

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from tests.app_helpers import APP_MAIN, app_env, figure, plain, reload_hub_client

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("apptest-sweep")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**app_env(tmp, use_real_demo=True), "RAM_STUDIO_SWEEP_CACHE": str(tmp / "sweeps")}.items():
            mp.setenv(k, v)
        reload_hub_client()
        st.cache_resource.clear()
        yield tmp
    reload_hub_client()
    st.cache_resource.clear()


def sweep_page() -> AppTest:
    at = AppTest.from_file(str(APP_MAIN), default_timeout=120)
    at.run()
    at.switch_page("views/sweep.py").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    return at


def wait(at: AppTest, button: str, seconds: float = 240) -> None:
    """Rerun until this session's job no longer disables `button`."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        at.run()
        if not at.button(key=button).disabled:
            return
        time.sleep(0.5)
    raise AssertionError("the job did not finish in time")


def quick(at: AppTest, limit: int = 5) -> None:
    at.multiselect(key="sweep_tasks").set_value(["code", "memory"]).run()
    at.number_input(key="sweep_limit").set_value(limit).run()


def test_sweep_runs_shows_results_and_fills_the_merge_page(env):
    at = sweep_page()
    assert at.button(key="sweep_start").disabled  # no candidates yet
    at.button(key="sweep_preset_table2").click().run()
    at.selectbox(key="sweep_method").set_value("task_arithmetic").run()
    at.text_input(key="sweep_task_arithmetic_lambda").set_value("0.5, 1.0").run()
    at.button(key="sweep_add").click().run()
    assert list(at.dataframe[0].value["grid"]) == ["ram_plus r=0.0,0.05,0.1,0.15,0.2", "task_arithmetic lambda=0.5,1.0"]
    quick(at)
    at.button(key="sweep_start").click().run()
    wait(at, "sweep_start")
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    (done,) = [s.value for s in at.success]
    assert done.startswith("7 candidates scored on validation, the 2 chosen on test")
    assert {c.key for c in at.get("plotly_chart")} == {"chart_sweep_chosen", "chart_sweep_param", "chart_sweep_time"}
    param = figure(at, "chart_sweep_param")  # the Table 2 view: one line per task and the average, against r
    assert [t.name for t in param.data] == ["code", "memory", "average", "best average"]
    assert list(param.data[0].x) == [0.0, 0.05, 0.1, 0.15, 0.2]
    bars = figure(at, "chart_sweep_chosen")  # chosen candidates next to the base and the agents
    x = list(bars.data[0].x)
    assert len(x) == 6 and x[2] == "base" and set(x[3:]) == {"code", "tool", "memory"}
    chosen = at.dataframe[1].value
    assert list(chosen["method"]) == ["ram_plus", "task_arithmetic"]
    every = at.dataframe[-1].value
    assert len(every) == 7 + 2 + 4 and set(every["split"]) == {"validation", "test"}
    # the Table 2 view: ram_plus against r
    assert at.selectbox(key="sweep_line_pick").value == ("ram_plus", "r")
    pick = at.selectbox(key="sweep_export_pick")
    best = pick.value
    assert best.method in ("ram_plus", "task_arithmetic")
    at.button(key="sweep_export").click().run()
    assert at.session_state["merge_method"] == best.method
    for name, value in best.params:
        assert at.session_state[f"param_{best.method}_{name}"] == value
    assert at.title[0].value == "Merge & export"
    assert at.selectbox(key="merge_method").value == best.method


def test_a_bad_grid_is_refused_with_a_clear_message(env):
    at = sweep_page()
    at.selectbox(key="sweep_method").set_value("ties").run()
    at.text_input(key="sweep_ties_density").set_value("0.1, 1.5").run()
    at.button(key="sweep_add").click().run()
    shown = plain(at.error[0].value)  # the message is escaped for Markdown
    assert "density=1.5" in shown and "must be in (0, 1]" in shown
    assert not at.dataframe  # nothing was added


def test_cancel_keeps_the_scores_and_a_restart_resumes(env):
    at = sweep_page()
    at.selectbox(key="sweep_method").set_value("task_arithmetic").run()
    at.text_input(key="sweep_task_arithmetic_lambda").set_value("0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0").run()
    at.button(key="sweep_add").click().run()
    quick(at, limit=3)
    at.button(key="sweep_start").click().run()
    deadline, text = time.time() + 120, ""
    while time.time() < deadline:  # wait for a few scores, watching the progress panel
        at.run()
        bars = at.get("progress")
        text = bars[0].proto.text if bars else ""
        if text.startswith("Validation: ") and int(text.split()[1]) >= 2:
            break
        time.sleep(0.2)
    assert text.startswith("Validation: ") and " of 10 scored" in text, text  # 10 candidates known so far
    assert len(at.dataframe[-1].value) >= 2  # the scores so far, under the bar
    at.button(key="sweep_cancel").click().run()
    wait(at, "sweep_start")
    (info,) = [i.value for i in at.info]
    assert info.startswith("Sweep cancelled;") and "resume" in info
    at.button(key="sweep_start").click().run()
    wait(at, "sweep_start")
    (done,) = [s.value for s in at.success]
    assert "scores reused from earlier runs" in done


def test_tune_scores_settings_a_and_b(env):
    at = AppTest.from_file(str(APP_MAIN), default_timeout=120)
    at.run()
    at.switch_page("views/tune.py").run()
    at.button(key="tune_measure").click().run()
    wait(at, "tune_measure")
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    table = at.table[-1].value
    assert list(table.columns) == ["A", "B", "B − A", "verdict"]
    assert list(table.index) == ["code", "tool", "memory", "average"]
    (caption,) = [c.value for c in at.caption if c.value.startswith("Accuracy (%) ± one standard error on the "
                                                                    "validation split")]
    assert "A: ram_plus eps=1e-05 r=0.1" in caption and "merged in" in caption


def test_a_sweep_on_lm_eval_tasks_from_the_page(env):
    at = sweep_page()
    at.button(key="sweep_preset_table2").click().run()
    at.radio(key="sweep_evaluator").set_value("lm-evaluation-harness").run()
    assert at.button(key="sweep_start").disabled  # no task named yet
    at.text_input(key="sweep_lm_tasks").set_value("ram_demo_memory").run()
    at.text_input(key="sweep_lm_include").set_value(str(APP_MAIN.parent.parent / "assets/demo/lm_eval_tasks")).run()
    at.number_input(key="sweep_limit").set_value(4).run()
    at.button(key="sweep_start").click().run()
    wait(at, "sweep_start")
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert at.success[0].value.startswith("5 candidates scored on validation, the 1 chosen on test")
    every = at.dataframe[-1].value
    assert "ram_demo_memory" in every.columns and len(every) == 5 + 1 + 4


def test_lm_eval_tasks_without_a_validation_split_are_refused_before_starting(env, tmp_path):
    import shutil

    folder = shutil.copytree(APP_MAIN.parent.parent / "assets/demo/lm_eval_tasks", tmp_path / "tasks")
    for f in folder.glob("*_validation.yaml"):
        f.unlink()
    at = sweep_page()
    at.button(key="sweep_preset_table2").click().run()
    at.radio(key="sweep_evaluator").set_value("lm-evaluation-harness").run()
    at.text_input(key="sweep_lm_tasks").set_value("ram_demo_code").run()
    at.text_input(key="sweep_lm_include").set_value(str(folder)).run()
    at.button(key="sweep_start").click().run()
    assert any("validation" in e.value for e in at.error), [e.value for e in at.error]
    assert not at.get("progress")

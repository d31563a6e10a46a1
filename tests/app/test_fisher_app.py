"""AppTest of Fisher merging in the app on the bundled demo: the Merge page's Fisher data (the demo's tasks or
lm-evaluation-harness tasks) and a merge job that runs the Fisher pass first (its Fishers in the cache, recorded in
the recipe); the Sweep page's Fisher grid, its Fig. 9 view with the Fisher pass in the time; a Fisher task the
agents cannot be matched to is one error box, not a traceback."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from tests.app_helpers import (
    APP_MAIN,
    app_env,
    plain,
    real_demo_complete,
    reload_hub_client,
)

ROOT = Path(__file__).resolve().parents[2]
LM_TASKS = ROOT / "assets" / "demo" / "lm_eval_tasks"

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(not real_demo_complete(), reason="needs the bundled demo (its tokenizer and tasks)")]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("apptest-fisher")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in app_env(tmp, use_real_demo=True).items():
            mp.setenv(k, v)
        reload_hub_client()
        st.cache_resource.clear()
        yield tmp
    reload_hub_client()
    st.cache_resource.clear()


def page(name: str) -> AppTest:
    at = AppTest.from_file(str(APP_MAIN), default_timeout=120)
    at.run()
    at.switch_page(f"views/{name}.py").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    return at


def wait(at: AppTest, button: str, seconds: float = 400) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        at.run()
        if not at.button(key=button).disabled and (at.success or at.error or at.info):
            return
        time.sleep(0.5)
    raise AssertionError("the job did not finish in time")


def fisher_form(at: AppTest, out: str, tasks: str = "", include: str | None = None) -> None:
    at.selectbox(key="merge_method").set_value("fisher").run()
    if include is not None:
        at.radio(key="fisher_source").set_value("lm-evaluation-harness").run()
        at.text_input(key="fisher_include").set_value(include).run()
    at.number_input(key="param_fisher_fisher_examples").set_value(4).run()
    at.selectbox(key="param_fisher_fisher_rule").set_value("greedy").run()
    at.text_input(key="fisher_tasks").set_value(tasks).run()
    at.text_input(key="merge_out").set_value(out).run()


def test_merge_page_runs_the_fisher_pass_then_the_merge(env):
    at = page("merge")
    fisher_form(at, str(env / "fisher-merged"))
    assert not at.exception and not at.error
    assert at.radio(key="fisher_source").value == "Demo tasks"
    at.button(key="start_merge").click().run()
    wait(at, "start_merge")
    assert not at.exception and not at.error, [plain(e.value) for e in [*at.exception, *at.error]]
    recipe = json.loads((env / "fisher-merged" / "ram_recipe.json").read_text())
    assert recipe["spec"]["method"] == "fisher" and recipe["fisher"]["rule"] == "greedy"
    agents = recipe["fisher"]["agents"]
    assert sorted(a["task"] for a in agents) == ["code", "memory", "tool"]
    assert all(a["task"] == a["label"] for a in agents)  # each agent on its own task (the app's agent order)
    assert recipe["fisher"]["n"] == 4 and all(a["seconds"] > 0 for a in agents)  # the pass ran, in the job
    from evaluation.fisher_cache import fisher_dir

    cached = {p.stem for p in fisher_dir().glob("*.safetensors")}
    assert {a["key"] for a in agents} <= cached  # each agent's Fisher kept in the analysis cache
    assert any("diagonal Fisher" in c.value for c in at.caption)  # the merge's note, under the result


def test_merge_page_fisher_on_lm_eval_tasks(env):
    pytest.importorskip("lm_eval")
    at = page("merge")
    fisher_form(at, str(env / "fisher-lm-eval"), tasks="ram_demo_code,ram_demo_tool,ram_demo_memory",
                include=str(LM_TASKS))
    at.button(key="start_merge").click().run()
    wait(at, "start_merge")
    assert not at.exception and not at.error, [plain(e.value) for e in [*at.exception, *at.error]]
    recipe = json.loads((env / "fisher-lm-eval" / "ram_recipe.json").read_text())
    assert recipe["fisher"]["origin"]["backend"] == "lm-eval"
    assert [a["task"] for a in recipe["fisher"]["agents"]] == ["ram_demo_code", "ram_demo_tool", "ram_demo_memory"]


def test_a_fisher_task_that_does_not_fit_is_an_error_box(env):
    at = page("merge")
    fisher_form(at, str(env / "never"), tasks="code,tool")
    at.button(key="start_merge").click().run()
    wait(at, "start_merge")
    assert not at.exception and len(at.error) == 1
    assert "2 Fisher task(s) for 3 agents" in plain(at.error[0].value)
    assert "Traceback" not in plain(at.error[0].value)
    assert not (env / "never").exists()


def test_sweep_page_sweeps_fisher_and_times_it_with_its_pass(env):
    at = page("sweep")
    at.selectbox(key="sweep_method").set_value("fisher").run()
    at.text_input(key="sweep_fisher_lambda").set_value("0.5, 1.0").run()
    at.text_input(key="sweep_fisher_fisher_examples").set_value("2, 4").run()
    at.multiselect(key="sweep_fisher_fisher_rule").set_value(["reference"]).run()
    at.button(key="sweep_add").click().run()
    assert at.text_input(key="sweep_fisher").value == ""  # each agent's task: by name
    at.multiselect(key="sweep_tasks").set_value(["code", "memory"]).run()
    at.number_input(key="sweep_limit").set_value(3).run()
    at.button(key="sweep_start").click().run()
    wait(at, "sweep_start")
    assert not at.exception and not at.error, [plain(e.value) for e in [*at.exception, *at.error]]
    every = at.dataframe[-1].value
    fisher = every[every["candidate"].str.startswith("fisher")]
    assert (fisher["Fisher s"] > 0).all()
    spec = json.loads([c for c in at.get("plotly_chart") if c.key == "chart_sweep_time"][0].proto.spec)
    assert "Fisher pass" in json.dumps(spec)

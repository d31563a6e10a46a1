"""Streamlit AppTest tests of every page: demo loaded → analysis → tuning → merge → readable errors."""
from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from tests.app_helpers import (
    app_env,
    figure,
    legend_off_the_plot,
    new_app,
    no_problems,
    plain,
    wait_merge,
)
from tests.paths import FIXTURES

pytestmark = pytest.mark.timeout(240)


def lambdas(at: AppTest) -> list[str]:
    return list(at.table[0].value["λ_t"])


def test_default_page_is_demo_heterogeneity(env):
    at = new_app().run()
    no_problems(at)
    assert at.title[0].value == "Heterogeneity"
    assert len(at.get("plotly_chart")) >= 5
    labels = [b.label for b in at.get("download_button")]
    assert labels.count("CSV") >= 5  # every chart has its data as CSV
    assert len(at.caption) >= 5
    # second visit: instant, from the process-wide cache
    t0 = time.perf_counter()
    at.switch_page("views/heterogeneity.py").run()
    assert time.perf_counter() - t0 < 10
    no_problems(at)


def test_heterogeneity_eps_slider(env):
    at = new_app().run()
    at.select_slider(key="het_eps").set_value(1e-3).run()
    no_problems(at)
    assert len(at.get("plotly_chart")) >= 5


def test_models_page_reports_demo(env):
    at = new_app()
    at.switch_page("views/models.py").run()
    no_problems(at)
    frame = at.dataframe[0].value
    assert list(frame["role"]) == ["base", "agent", "agent", "agent"]
    assert any("Compatible" in plain(s.value) for s in at.success)
    assert [m.label for m in at.metric][:2] == ["To download", "Disk needed"]


def test_models_bad_path_shows_error(env, tmp_path):
    at = new_app()
    at.switch_page("views/models.py").run()
    at.radio(key="model_source").set_value("Custom: local folders or Hub ids").run()
    at.text_input(key="custom_base").set_value(str(tmp_path / "missing-model")).run()
    assert not at.exception
    assert at.error and "does not exist" in plain(at.error[0].value)
    at.button(key="use_models").click().run()
    assert not at.exception
    assert any("does not exist" in plain(e.value) for e in at.error)


def test_models_hub_preset_offline_is_readable(env):
    at = new_app()
    at.switch_page("views/models.py").run()
    at.radio(key="model_source").set_value(next(o for o in at.radio(key="model_source").options if "Qwen" in o)).run()
    no_problems(at)  # nothing is fetched until asked
    at.button(key="check_compat").click().run()
    assert not at.exception
    assert at.error and "Hub" in plain(at.error[0].value)


def test_tune_changes_lambda_without_rereading(env):
    at = new_app().run()
    at.switch_page("views/tune.py").run()
    no_problems(at)
    before = lambdas(at)
    at.slider(key="tune_r").set_value(0.5).run()
    no_problems(at)
    after = lambdas(at)
    assert after != before
    assert all(float(v) >= 1.0 for v in after)
    at.radio(key="tune_rule").set_value("soft").run()
    no_problems(at)
    assert lambdas(at) != after
    at.radio(key="tune_scope").set_value("tensor").run()
    no_problems(at)
    cols = at.table[0].value.columns
    assert "λ range (tensors)" in cols and "ρ per tensor: median (range)" in cols and "ρ_t (whole model)" in cols
    assert len(at.get("plotly_chart")) == 3  # λ(ρ), retention, A | B


def test_tune_is_fast(env):
    from analysis import tables
    from app import state

    new_app().run()  # fills the analysis cache
    res = state.cached_analysis(state.demo_selection())
    assert res is not None
    t0 = time.perf_counter()
    for r in (0.0, 0.1, 0.3):
        tables.lambda_table(res, 1e-5, r, 2.0, "clip", "global")
        tables.signal_retention(res, 1e-5, r, 2.0, "clip", "global")
    assert (time.perf_counter() - t0) / 3 < 1.0


def test_dilution_page(env):
    at = new_app()
    at.switch_page("views/dilution.py").run()
    no_problems(at)
    assert len(at.get("plotly_chart")) >= 2
    from app.state import demo_results

    table1 = demo_results() / "table1.csv"
    if table1.exists():  # the caption says what the mini Table 1 shows, from its numbers
        import pandas as pd

        from analysis.regimes import LABELS

        t = pd.read_csv(table1).set_index("model")
        text = " ".join(plain(c.value) for c in at.caption)
        assert "should survive" not in text
        best = t.drop(index=["base", "code", "tool", "memory"])["avg"].idxmax()
        assert f"Best merge on average: {LABELS[best]} ({t.at[best, 'avg']:.1f} ± {t.at[best, 'avg_se']:.1f})" in text
        # RAM against averaging: the paired difference the committed comparisons hold, judged at two s.e.
        pairs = pd.read_csv(table1.parent / "table1_comparisons.csv")
        row = pairs[(pairs["a"] == "average") & (pairs["b"] == "ram")].iloc[0]
        verb = "beats" if -row["diff"] > 2 * row["stderr"] else "trails" if row["diff"] > 2 * row["stderr"] else None
        pm = lambda m: f"{t.at[m, 'avg']:.1f} ± {t.at[m, 'avg_se']:.1f}"  # noqa: E731
        if verb:
            assert (f"RAM ({pm('ram')}) {verb} averaging ({pm('average')}) by {abs(row['diff']):.1f} ± "
                    f"{row['stderr']:.1f} points (paired per example)") in text
        else:
            assert f"RAM ({pm('ram')}) and averaging ({pm('average')}) are within noise" in text
    at.slider(key="toy_n").set_value(5).run()
    no_problems(at)
    at.slider(key="toy_o0").set_value(1.0).run()
    no_problems(at)
    for i in range(5):  # extremes: every agent dense and fully overlapping
        at.slider(key=f"toy_d{i}").set_value(0.6)
        at.slider(key=f"toy_o{i}").set_value(1.0)
    at.run()
    no_problems(at)


def test_merge_writes_folder_that_loads(env, tmp_path):
    at = new_app().run()
    at.switch_page("views/tune.py").run()
    at.slider(key="tune_r").set_value(0.3).run()
    at.switch_page("views/merge.py").run()
    no_problems(at)
    assert at.number_input(key="param_ram_plus_r").value == pytest.approx(0.3)  # pre-filled from Tune
    out = tmp_path / "out" / "merged"
    at.text_input(key="merge_out").set_value(str(out)).run()
    at.button(key="start_merge").click().run()
    wait_merge(at)
    no_problems(at)
    assert any("Merged into" in plain(s.value) for s in at.success)
    assert (out / "ram_recipe.json").exists() and (out / "README.md").exists()
    labels = [b.label for b in at.get("download_button")]
    assert {"Model card", "Recipe", "Statistics", "Zip of the model"} <= set(labels)

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=False)
    assert sum(p.numel() for p in model.parameters()) > 0

    # the same folder again: refused with a readable message (not a traceback)
    at.button(key="start_merge").click().run()
    wait_merge(at)
    assert not at.exception
    assert any("not empty" in plain(e.value) for e in at.error)


def test_merge_bad_output_shows_error(env, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    at = new_app()
    at.switch_page("views/merge.py").run()
    at.text_input(key="merge_out").set_value(str(blocker)).run()
    at.button(key="start_merge").click().run()
    assert not at.exception
    assert any("is a file" in plain(e.value) for e in at.error)


@pytest.mark.parametrize("where", ["agent", "demo-root", "inside-base"])
def test_overwrite_box_never_replaces_an_input(env, tmp_path, where):
    """The app checks the output with the same placement rules as the CLI, before any job starts."""
    from merging.reading.refs import demo_root
    from tests.factory import checksums

    root = demo_root()
    out = {"agent": root / "code", "demo-root": root, "inside-base": root / "base" / "merged"}[where]
    before = checksums([root])
    at = new_app()
    at.switch_page("views/merge.py").run()
    at.text_input(key="merge_out").set_value(str(out)).run()
    at.checkbox(key="merge_overwrite").check().run()
    at.button(key="start_merge").click().run()
    assert not at.exception
    assert any("the input" in plain(e.value) for e in at.error), [plain(e.value) for e in at.error]
    assert jobs_running() is None and checksums([root]) == before


def jobs_running():
    from app import jobs

    return jobs.manager().running()


def test_one_merge_at_a_time(env, tmp_path):
    from app import jobs
    from merging.common.errors import MergeCancelled
    from merging.recipe import MergeSpec

    started = threading.Event()

    def slow(spec, *, overwrite, counts, overlap, provenance, progress, cancel, count_progress):
        started.set()
        cancel.wait(60)
        raise MergeCancelled()

    from app.views.merge import run_merge

    def submit(out: Path, owner: str, runner):
        spec = MergeSpec("demo:base", ["demo:code", "demo:tool"], "ram", {}, str(out))
        return mgr.submit("merge", owner, f"a merge into {out.name}", lambda j: runner(spec, j), merges=True, out=out,
                          request=spec)

    mgr = jobs.manager()
    job = submit(tmp_path / "slow", "someone-else",
                 lambda spec, j: slow(spec, overwrite=False, counts=None, overlap=None, provenance=None,
                                      progress=None, cancel=j.cancel, count_progress=None))
    try:
        assert started.wait(10)
        with pytest.raises(jobs.Busy, match="another session"):
            submit(tmp_path / "x", "me", run_merge)
        at = new_app()
        at.switch_page("views/merge.py").run()
        assert any("Busy" in plain(w.value) for w in at.warning)
        at.text_input(key="merge_out").set_value(str(tmp_path / "mine")).run()
        at.button(key="start_merge").click().run()
        assert not at.exception
        assert any("already running" in plain(e.value) for e in at.error)
        assert not (tmp_path / "mine").exists()
    finally:
        assert not mgr.cancel(job.id, "me")  # only the session that started a job may cancel it
        assert mgr.cancel(job.id, "someone-else")
        job.thread.join(10)
    assert job.status == "cancelled"
    assert mgr.running() is None


def test_cancel_from_the_ui(env, tmp_path, monkeypatch):
    from app import jobs

    gate = threading.Event()

    def gated(spec, *, overwrite, counts, overlap, provenance, progress, cancel, count_progress):
        from merging.common.errors import MergeCancelled

        gate.set()
        cancel.wait(60)
        raise MergeCancelled()

    at = new_app()
    at.switch_page("views/merge.py").run()
    at.text_input(key="merge_out").set_value(str(tmp_path / "c")).run()
    mgr = jobs.manager()
    monkeypatch.setattr("merging.merge.merge_to_folder", gated)  # what the page's merge job runs
    at.button(key="start_merge").click().run()
    assert gate.wait(10)
    at.run()
    assert at.button(key="cancel_merge")
    at.button(key="cancel_merge").click().run()
    wait_merge(at, 20)
    assert any("cancelled" in plain(i.value) for i in at.info)
    assert mgr.running() is None
    assert not Path(tmp_path / "c").exists()


def test_dilution_shows_demo_evidence(env, tmp_path, monkeypatch):
    """With results next to the demo models, Table 1 and the reward curves are drawn."""
    import pandas as pd

    from tests.app_helpers import build_demo

    demo = build_demo(tmp_path / "models")
    results = tmp_path / "results"
    results.mkdir()
    pd.DataFrame({"model": ["base", "average", "ram", "ram_plus"], "params": ["", "", "eps=1e-05", "r=0.1"],
                  "code": [10.0, 20.0, 30.0, 35.0], "tool": [5.0, 15.0, 40.0, 41.0],
                  "memory": [1.0, 12.0, 33.0, 36.0], "memory@8": [2.0, 3.0, 4.0, 5.0],
                  "avg": [5.3, 15.7, 34.3, 37.3], "val_avg": [5.0, 15.0, 34.0, 37.0]}).to_csv(results / "table1.csv",
                                                                                            index=False)
    rows = [{"stage": "rl", "agent": a, "task": a, "step": s, "mean_reward": s / 10 * (i + 1) / 3}
            for i, a in enumerate(["code", "tool", "memory"]) for s in range(1, 11)]
    pd.DataFrame(rows).to_csv(results / "training_log.csv", index=False)
    monkeypatch.setenv("RAM_STUDIO_DEMO_ROOT", str(demo))
    at = new_app()
    at.switch_page("views/dilution.py").run()
    no_problems(at)
    assert [i.value for i in at.info if "Fig. 3" in plain(i.value)]  # fig3.csv absent: said so, not an error
    assert len(at.get("plotly_chart")) == 4  # toy heatmaps, toy retention, Table 1, reward curves

    shutil.copy(FIXTURES / "fig3.csv", results / "fig3.csv")  # the shape the demo's build writes
    at = new_app()
    at.switch_page("views/dilution.py").run()
    no_problems(at)
    assert not at.info  # no "results not here yet" note
    charts = at.get("plotly_chart")
    assert len(charts) == 5 and "chart_fig3" in [c.key for c in charts]
    bars = {t.name: dict(zip(t.x, t.y)) for t in figure(at, "chart_fig3").data}
    assert bars["unique region only"] == pytest.approx({"code": 31.0, "tool": 79.0, "memory": 93.0})
    assert bars["unique region ÷ N"] == pytest.approx({"code": 25.0, "tool": 70.0, "memory": 55.0})
    assert bars["base"] == pytest.approx({"code": 23.33, "tool": 67.0, "memory": 46.67})
    assert bars["full agent"] == pytest.approx({"code": 38.67, "tool": 85.33, "memory": 100.0})
    (results / "fig3.csv").write_text("no,columns,we,know\n1,2,3,4\n")
    at = new_app()
    at.switch_page("views/dilution.py").run()
    assert not at.exception
    assert any("could not be read" in plain(i.value) for i in at.info)


def test_custom_local_folders_are_analysed(env, tmp_path):
    """Local folders chosen on Models become the selection every page analyses."""
    from tests.app_helpers import build_demo

    root = build_demo(tmp_path / "family")
    at = new_app()
    at.switch_page("views/models.py").run()
    at.radio(key="model_source").set_value("Custom: local folders or Hub ids").run()
    at.text_input(key="custom_base").set_value(str(root / "base")).run()
    at.text_area(key="custom_agents").set_value(f"{root / 'code'}\n{root / 'tool'}").run()
    no_problems(at)
    assert len(at.dataframe[0].value) == 3
    at.button(key="use_models").click().run()
    no_problems(at)
    at.switch_page("views/heterogeneity.py").run()
    no_problems(at)
    assert len(at.get("plotly_chart")) >= 5
    assert set(at.session_state["ram_selection"].agents) == {str(root / "code"), str(root / "tool")}
    sidebar = "".join(h.proto.body for h in at.sidebar.get("html"))
    assert "<code>code</code>" in sidebar and "…/family/code" in sidebar  # the label, then the path's end
    assert f"title='{root / 'code'}'" in sidebar  # the whole path on hover
    at.switch_page("views/merge.py").run()
    no_problems(at)
    assert Path(at.text_input(key="merge_out").value).name.startswith("base-ram_plus-")  # the base's folder name


def test_models_shows_what_the_base_policy_costs(env, tmp_path):
    """Per agent, the Models page shows what `--on-mismatch base` would drop, and refuses a heavy loss."""
    import shutil

    from safetensors.torch import save_file

    from tests.app_helpers import build_demo
    from tests.factory import state

    root = build_demo(tmp_path / "family")
    t = state(root / "tool")
    t["model.embed_tokens.weight"] = t["model.embed_tokens.weight"][:-1].contiguous()  # a smaller vocabulary
    small = tmp_path / "small-vocab"
    small.mkdir()
    save_file(t, small / "model.safetensors")
    noprefix = tmp_path / "no-prefix"
    noprefix.mkdir()
    save_file({k.removeprefix("model."): v for k, v in state(root / "memory").items()}, noprefix / "model.safetensors")
    for f in (small, noprefix):
        shutil.copy(root / "base" / "config.json", f / "config.json")
    at = new_app()
    at.switch_page("views/models.py").run()
    at.radio(key="model_source").set_value("Custom: local folders or Hub ids").run()
    at.text_input(key="custom_base").set_value(str(root / "base")).run()
    at.text_area(key="custom_agents").set_value(f"{root / 'code'}\n{small}\n{noprefix}").run()
    assert not at.exception
    losses = at.dataframe[-1].value.set_index("agent")
    assert losses.loc["small-vocab", "'base' policy"] == "allowed"
    assert losses.loc["no-prefix", "'base' policy"] == "refused (loses too much)"
    assert any("'model.' prefix" in plain(i.value) for i in at.info)
    at.text_area(key="custom_agents").set_value(f"{root / 'code'}\n{root / 'code'}").run()
    assert any("same model as agent" in plain(e.value) for e in at.error)
    assert not any("None" in str(df.value) for df in at.dataframe)


def test_evaluate_merged_model_adds_a_row(env, tmp_path, monkeypatch):
    """The demo's evaluate button runs in the background, counts examples scored task by task (not time),
    and puts the merge at the top of the comparison table."""
    import pandas as pd

    pytest.importorskip("demo.evaluate")
    from demo import evaluate

    seen, gates = [], {t: threading.Event() for t in ("code", "tool", "memory")}

    def fake_eval(folder, tasks, split="test", limit=None):
        seen.append((Path(folder), tuple(tasks), split))
        assert all(gates[t].wait(30) for t in tasks)
        return pd.DataFrame({"task": list(tasks), "subset": ["all"] * len(tasks), "n": [10] * len(tasks),
                             "correct": [7] * len(tasks), "accuracy": [0.7] * len(tasks)})

    def progress_text(at) -> str:
        bars = at.get("progress")
        return bars[0].proto.text if bars else ""

    def until(at, pred, what):
        deadline = time.time() + 30
        while time.time() < deadline:
            at.run()
            if pred(at):
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}: progress {progress_text(at)!r}")

    monkeypatch.setattr(evaluate, "evaluate_model", fake_eval)
    at = new_app()
    at.switch_page("views/merge.py").run()
    out = tmp_path / "eval-me"
    at.text_input(key="merge_out").set_value(str(out)).run()
    at.button(key="start_merge").click().run()
    wait_merge(at)
    at.button(key="eval_merged").click().run()
    until(at, lambda a: "0 of 900 examples scored" in progress_text(a) and "code" in progress_text(a), "code")
    assert at.get("progress")[0].proto.value == 0
    gates["code"].set()
    until(at, lambda a: "300 of 900 examples scored" in progress_text(a) and "tool" in progress_text(a), "tool")
    assert at.get("progress")[0].proto.value == 33 and "left" in progress_text(at)
    gates["tool"].set()
    until(at, lambda a: "600 of 900" in progress_text(a), "memory")
    gates["memory"].set()
    until(at, lambda a: any("(this session)" in str(df.value.index.tolist()) for df in a.dataframe), "the row")
    no_problems(at)
    assert [s[1] for s in seen] == [("code",), ("tool",), ("memory",)] and seen[0][0] == out
    assert all(s[2] == "test" for s in seen)
    table = [df.value for df in at.dataframe if "(this session)" in str(df.value.index.tolist())][0]
    assert table.index[0] == "ram_plus (this session)"  # the new row is the first one, not below the fold
    assert str(table.loc["ram_plus (this session)", "avg"]).startswith("70.00 ± ")  # the average ± its s.e.


def test_rerun_reads_the_weights_again(env):
    at = new_app().run()
    at.button(key="het_rerun").click().run()
    no_problems(at)
    assert any("analysed in" in plain(c.value) for c in at.caption)
    assert len(at.get("plotly_chart")) >= 5


def test_without_demo_every_page_explains(env, tmp_path, monkeypatch):
    """No demo models: each page says what to do instead of failing."""
    monkeypatch.setenv("RAM_STUDIO_DEMO_ROOT", str(tmp_path / "nothing-here"))
    at = new_app().run()
    assert not at.exception
    assert at.info and "Models" in plain(at.info[0].value)
    for page in ("models", "tune", "dilution", "merge"):
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, page
        assert not at.error, page


def test_dilution_falls_back_to_agent_accuracy(env, tmp_path, monkeypatch):
    """Before table1.csv exists, the build's accuracy.csv (base and agents) is charted instead."""
    import pandas as pd

    from tests.app_helpers import build_demo

    demo = build_demo(tmp_path / "models")
    (tmp_path / "results").mkdir()
    rows = [{"model": m, "split": "test", "task": t, "subset": "all", "n": 10, "correct": 3, "accuracy": 0.3}
            for m in ("base", "code", "tool", "memory") for t in ("code", "tool", "memory")]
    pd.DataFrame(rows).to_csv(tmp_path / "results" / "accuracy.csv", index=False)
    monkeypatch.setenv("RAM_STUDIO_DEMO_ROOT", str(demo))
    at = new_app()
    at.switch_page("views/dilution.py").run()
    no_problems(at)
    assert len(at.get("plotly_chart")) == 3


def test_hub_selection_asks_before_downloading(env):
    """Hub models are never downloaded implicitly. Offline, "Use these models" refuses ids it cannot reach
    (naming every one), and a Hub selection made earlier shows what is missing instead of failing."""
    from app import state

    at = new_app()
    at.switch_page("views/models.py").run()
    preset = next(o for o in at.radio(key="model_source").options if "Llama" in o)
    at.radio(key="model_source").set_value(preset).run()
    before = at.session_state["ram_selection"]
    at.button(key="use_models").click().run()
    assert not at.exception
    assert any("not selected" in plain(e.value) for e in at.error)
    listed = next(plain(e.value) for e in at.error if "could not be read" in plain(e.value))
    base, agents = state.PRESETS[preset]
    assert "4 of 4 models" in listed and all(r in listed for r in [base, *agents])
    assert at.session_state["ram_selection"] == before  # unchanged
    at.session_state["ram_selection"] = state.Selection(base, tuple(agents), "preset")  # chosen while online
    at.switch_page("views/heterogeneity.py").run()
    assert not at.exception
    assert any("not downloaded yet" in plain(w.value) for w in at.warning)
    assert not at.get("plotly_chart")
    assert at.error and "HF_HUB_OFFLINE" in plain(at.error[0].value)  # the tests run with it set: said so
    at.switch_page("views/dilution.py").run()  # the rest of the app still works
    no_problems(at)
    assert at.get("plotly_chart")


def test_every_method_has_a_form_and_average_merges(env, tmp_path):
    from merging.methods import METHODS

    at = new_app()
    at.switch_page("views/merge.py").run()
    for name in METHODS:
        at.selectbox(key="merge_method").set_value(name).run()
        no_problems(at)
    at.selectbox(key="merge_method").set_value("average").run()
    at.text_input(key="merge_out").set_value(str(tmp_path / "avg")).run()
    at.button(key="start_merge").click().run()
    wait_merge(at)
    no_problems(at)
    assert (tmp_path / "avg" / "config.json").exists()


def test_form_is_never_left_disabled_after_a_fast_failure(env, tmp_path, monkeypatch):
    """A merge that fails within milliseconds could leave the form (and the Overwrite box needed to
    fix it) disabled until the page was switched. The page drew the form from one look at the job and the
    panel below it from another; a job ending between the two left a disabled form with no progress fragment
    to redraw it. Sweep the failure time across the page's run: after every run, a disabled form must come
    with the progress panel, and the failure must end with an enabled form and one error."""
    from merging.common.errors import RamStudioError

    delay = {"s": 0.0}

    def fails_fast(spec, *, overwrite, counts, overlap, provenance, progress, cancel, count_progress):
        time.sleep(delay["s"])
        raise RamStudioError(f"simulated failure into {Path(spec.out).name}.", "Tick 'Overwrite'.")

    monkeypatch.setattr("merging.merge.merge_to_folder", fails_fast)  # what the page's merge job runs
    at = new_app()
    at.switch_page("views/merge.py").run()
    for i, d in enumerate([0.0, 0.001, 0.003, 0.006, 0.01, 0.015, 0.02, 0.03, 0.045, 0.06, 0.08, 0.11, 0.15,
                           0.2, 0.3]):
        delay["s"] = d
        at.text_input(key="merge_out").set_value(str(tmp_path / f"fast-{i}")).run()
        at.button(key="start_merge").click().run()
        for _ in range(40):
            assert not at.exception
            panel = [b for b in at.button if b.key == "cancel_merge"]
            if at.button(key="start_merge").disabled:
                assert panel, f"form disabled with no progress panel (failure after {d * 1000:.0f} ms)"
                assert at.checkbox(key="merge_overwrite").disabled
                time.sleep(0.05)
                at.run()
                continue
            break
        assert not at.button(key="start_merge").disabled and not at.checkbox(key="merge_overwrite").disabled
        errors = [plain(e.value) for e in at.error]
        assert len(errors) == 1 and f"fast-{i}" in errors[0], errors


def test_merge_default_folder_follows_the_settings_and_is_checked_before_starting(env, tmp_path, monkeypatch):
    """The suggested folder is ./merged-models/<base>-<method>-<hash of the settings> (never the README's
    `merged`), a typed folder is kept, and an existing folder is refused before any job starts, with a hint
    that names the app's Overwrite box."""
    from app import jobs

    monkeypatch.chdir(tmp_path)
    at = new_app()
    at.switch_page("views/merge.py").run()
    no_problems(at)
    first = Path(at.text_input(key="merge_out").value)
    assert first.parent == tmp_path / "merged-models" and first.name.startswith("demo-ram_plus-")
    at.number_input(key="param_ram_plus_r").set_value(0.25).run()
    second = Path(at.text_input(key="merge_out").value)
    assert second.parent == first.parent and second.name.startswith("demo-ram_plus-") and second != first
    at.number_input(key="param_ram_plus_r").set_value(0.1).run()
    assert Path(at.text_input(key="merge_out").value) == first  # the same settings, the same folder
    at.selectbox(key="merge_method").set_value("average").run()
    assert Path(at.text_input(key="merge_out").value).name.startswith("demo-average-")

    mine = tmp_path / "my-folder"
    at.text_input(key="merge_out").set_value(str(mine)).run()
    at.selectbox(key="merge_method").set_value("ram").run()
    assert at.text_input(key="merge_out").value == str(mine)  # a typed folder survives other changes
    at.button(key="merge_out_reset").click().run()
    suggested = Path(at.text_input(key="merge_out").value)
    assert suggested.parent == tmp_path / "merged-models" and suggested.name.startswith("demo-ram-")

    suggested.mkdir(parents=True)
    (suggested / "notes.txt").write_text("someone's")
    before = [j.id for j in jobs.manager().all()]
    at.button(key="start_merge").click().run()
    assert not at.exception and [j.id for j in jobs.manager().all()] == before  # refused before any job exists
    errors = [plain(e.value) for e in at.error]
    assert len(errors) == 1 and "exists and is not empty" in errors[0] and "'Overwrite' box" in errors[0]
    assert not at.checkbox(key="merge_overwrite").disabled and not at.button(key="start_merge").disabled
    at.checkbox(key="merge_overwrite").check().run()
    at.button(key="start_merge").click().run()
    errors = [plain(e.value) for e in at.error]
    assert len(errors) == 1 and "refusing to overwrite" in errors[0]  # the new error replaces the old one
    assert (suggested / "notes.txt").read_text() == "someone's"


# ---------------------------------------------------------------- Exploration, colours, downloads

def chart_colors(at: AppTest, key: str) -> dict[str, str]:
    """Agent → bar colour of a one-trace bar chart (e.g. density per agent)."""
    bar = figure(at, key).data[0]
    return dict(zip(bar.x, bar.marker.color))


def use_models(at: AppTest, base: str, agents: list[str]) -> None:
    at.switch_page("views/models.py").run()
    at.radio(key="model_source").set_value("Custom: local folders or Hub ids").run()
    at.text_input(key="custom_base").set_value(base).run()
    at.text_area(key="custom_agents").set_value("\n".join(agents)).run()
    at.button(key="use_models").click().run()
    no_problems(at)


def test_agent_colours_follow_the_agent_not_its_position(env):
    """The same models listed in another order keep their colours, in the charts and the sidebar;
    the toy's A1…A5 never reuse a real agent's colour."""
    from app import charts

    at = new_app().run()
    before = chart_colors(at, "chart_density_per_agent")
    sidebar = "".join(h.proto.body for h in at.sidebar.get("html"))
    for agent, color in before.items():
        assert f"background:{color}" in sidebar.split(f"<code>{agent}</code>")[0].rsplit("<div", 1)[1]
    demo = at.session_state["ram_selection"]
    use_models(at, demo.base, list(reversed(demo.agents)))
    at.switch_page("views/heterogeneity.py").run()
    no_problems(at)
    after = chart_colors(at, "chart_density_per_agent")
    assert list(after) == list(reversed(list(before)))  # the bars follow the new order…
    assert after == before  # …and every agent keeps its colour
    assert set(charts.TOY_PALETTE).isdisjoint(charts.AGENT_PALETTE)
    at.switch_page("views/dilution.py").run()
    heat = figure(at, "chart_toy_heatmaps")
    titles = [a.text for a in heat.layout.annotations if "τ of A" in a.text]
    assert titles and all(c not in t for t in titles for c in charts.AGENT_PALETTE)
    assert {b.marker.color for b in figure(at, "chart_toy_retention").data} <= set(charts.TOY_PALETTE)


def test_rho_views_per_layer_module_and_tensor(env):
    """ρ_t is on Heterogeneity, globally and per layer / module / layer × module / tensor, as ρ or λ."""
    from analysis import tables
    from app import state

    at = new_app().run()
    no_problems(at)
    res = state.cached_analysis(state.demo_selection())
    rho_table = next(df.value for df in at.dataframe if "ρ_t = shared / unique" in df.value.columns)
    lam = tables.lambda_table(res, 1e-5, 0.1, 2.0).set_index("agent")
    for _, row in rho_table.iterrows():
        assert float(row["ρ_t = shared / unique"]) == pytest.approx(lam.loc[row["agent"], "rho"], rel=1e-3)
        assert "%" in row["chance"] and "%" in row["unique share"]
    fig = figure(at, "chart_rho_by_layer")
    assert fig.layout.yaxis.type == "log" and {t.name for t in fig.data} == set(res.agents)
    by_layer = tables.rho_lambda_by(res, 1e-5, "layer", 0.1, 2.0)
    code = by_layer[by_layer["agent"] == "code"].sort_values("layer")
    assert [y for y in fig.data[[t.name for t in fig.data].index("code")].y] == pytest.approx(list(code["rho"]))

    at.segmented_control(key="het_rho_by").set_value("module").run()
    no_problems(at)
    assert figure(at, "chart_rho_by_module").data[0].type == "bar"
    at.segmented_control(key="het_rho_what").set_value("λ").run()
    at.segmented_control(key="het_rho_scope").set_value("tensor").run()
    no_problems(at)
    lam_mod = figure(at, "chart_lambda_by_module")
    # λ bars grow from 1 (base) in λ's own units, on a linear axis that starts at 1
    assert all(t.base == 1.0 for t in lam_mod.data)
    assert all(1.0 <= 1.0 + v <= 1.2 + 1e-9 for t in lam_mod.data for v in t.y if v is not None)
    assert [1.0 + v for v in lam_mod.data[0].y] == pytest.approx(list(lam_mod.data[0].customdata))
    assert lam_mod.layout.yaxis.type in (None, "linear", "-") and lam_mod.layout.yaxis.range[0] == 1.0
    at.segmented_control(key="het_rho_by").set_value("layer × module").run()
    no_problems(at)
    assert figure(at, "chart_lambda_by_layer_module").data[0].type == "heatmap"
    at.segmented_control(key="het_rho_by").set_value("tensor").run()
    no_problems(at)
    per_tensor = next(df.value for df in at.dataframe if "tensor" in df.value.columns and "ρ" in df.value.columns)
    assert len(per_tensor) == res.frame[res.frame["eps"] == 1e-5].shape[0]
    # the norms / sign-conflict chart and the unique-vs-chance chart are drawn, with the chance marker
    # (a long legend entry wraps onto two lines: compare the names as one line)
    assert {(t.name or "").replace("<br>", " ") for t in figure(at, "chart_unique_vs_chance").data} == {
        "measured", "chance (independent masks)", "chance, tensor by tensor", "chance, tensor × binade"}
    nc = figure(at, "chart_norms_and_sign_conflicts")
    assert {(t.name or "").replace("<br>", " ") for t in nc.data} >= {"unique part ‖τ_unique‖",
                                                                      "shared part ‖τ_shared‖"}
    at.toggle(key="het_log").set_value(True).run()
    assert figure(at, "chart_unique_vs_chance").layout.yaxis.type == "log"
    assert figure(at, "chart_unique_shared_by_layer").layout.yaxis.type == "log"


def test_overlap_bars_and_layer_shares_show_chance(env):
    """Every unique share the app draws comes with its chance level."""
    from analysis import tables
    from app import state

    at = new_app().run()
    res = state.cached_analysis(state.demo_selection())
    uvc = tables.unique_vs_chance(res, 1e-5).set_index("agent")
    notes = {a.x: a.text for a in figure(at, "chart_overlap_distribution").layout.annotations}
    from app.charts import pct

    for agent in res.agents:
        assert f"unique {pct(uvc.loc[agent, 'unique_share'])}" in notes[agent]
        assert f"chance {pct(uvc.loc[agent, 'chance_unique_share'])}" in notes[agent]
    lines = {t.name for t in figure(at, "chart_unique_shared_by_layer").data}
    assert {f"{a}: chance" for a in res.agents} <= lines
    paper_table = next((df.value for df in at.dataframe if "paper chance" in df.value.columns), None)
    if paper_table is not None:  # the real demo's agents are named like the paper's
        assert "chance (independent masks)" in paper_table.columns


def test_tune_a_b_comparison_and_lambda_axis(env):
    """Tune compares two settings side by side, and the λ(ρ) axis shows every agent."""
    import math

    from analysis import tables
    from app import state

    at = new_app().run()
    at.switch_page("views/tune.py").run()
    no_problems(at)
    res = state.cached_analysis(state.demo_selection())
    curve = figure(at, "chart_lambda_curve")
    lo, hi = curve.layout.xaxis.range
    log = curve.layout.xaxis.type == "log"
    for t in curve.data[1:]:
        x = math.log10(t.x[0]) if log else t.x[0]
        assert lo <= x <= hi, f"{t.name} off the ρ axis"

    def ab():
        return next(t.value for t in at.table if "λ_t B" in t.value.columns)

    first = ab()
    a = {"eps": 1e-5, "r": 0.1, "alpha": 2.0, "rule": "clip", "rho_scope": "global"}
    expect = tables.compare_settings(res, a, {**a, "eps": 1e-3}).set_index("agent")
    for agent, row in first.iterrows():
        assert float(row["λ_t B"]) == pytest.approx(expect.loc[agent, "lambda_B"], abs=1e-4)
        assert float(row["kept B"]) == pytest.approx(expect.loc[agent, "kept_B"], rel=1e-3)
    at.radio(key="tune_b_rule").set_value("soft").run()
    at.slider(key="tune_b_r").set_value(0.5).run()
    no_problems(at)
    soft = tables.compare_settings(res, a, {**a, "eps": 1e-3, "rule": "soft", "r": 0.5}).set_index("agent")
    for agent, row in ab().iterrows():
        assert float(row["λ_t B"]) == pytest.approx(soft.loc[agent, "lambda_B"], abs=1e-4)
        assert float(row["λ_t A"]) == pytest.approx(soft.loc[agent, "lambda_A"], abs=1e-4)
    names = {t.name for t in figure(at, "chart_compare_a_b").data}
    assert names == {"setting A", "setting B"}


def test_chart_downloads_are_named_after_chart_and_parameters(env):
    """The camera button saves a titled figure named after the chart and its parameters, as a PNG at
    print scale or an SVG (the sidebar's choice). The browser test downloads both and the CSV."""
    at = new_app().run()
    chart = next(c for c in at.get("plotly_chart") if c.key == "chart_density_per_agent")
    opts = json.loads(chart.proto.config)["toImageButtonOptions"]
    assert opts["format"] == "png" and opts["scale"] * opts["width"] >= 3000
    assert opts["filename"] == "density_per_agent__eps-1e-5__agents-code+memory+tool"
    assert "Density per agent" in figure(at, "chart_density_per_agent").layout.title.text
    assert "ε = 1e-5" in figure(at, "chart_density_per_agent").layout.title.text
    at.sidebar.radio(key="fig_format").set_value("SVG").run()
    chart = next(c for c in at.get("plotly_chart") if c.key == "chart_density_per_agent")
    assert json.loads(chart.proto.config)["toImageButtonOptions"]["format"] == "svg"


# ---------------------------------------------------------------- mergekit YAML on the Merge page

def test_mergekit_yaml_fills_the_form_and_shows_the_settings(env):
    """A pasted mergekit YAML fills method, parameters and models; the current settings are shown as
    YAML, or the reason they cannot be."""
    from merging.reading.refs import demo_root

    at = new_app()
    at.switch_page("views/merge.py").run()
    no_problems(at)
    # ram_plus, global ρ
    assert any("cannot express" in plain(i.value) and "global scope" in plain(i.value) for i in at.info)
    assert any("merge_method: ramplus_tl" in plain(c.value) for c in at.code)  # the nearest config is shown
    before = at.session_state["ram_selection"]
    at.text_area(key="mk_text").set_value(
        "merge_method: ties\nbase_model: demo:base\nmodels:\n  - model: demo:tool\n  - model: demo:code\n"
        "parameters:\n  weight: 1.0\n  density: 0.3\n  lambda: 0.8\ndtype: float32\n").run()
    at.button(key="mk_load").click().run()
    no_problems(at)
    assert at.selectbox(key="merge_method").value == "ties"
    assert at.number_input(key="param_ties_density").value == pytest.approx(0.3)
    assert at.number_input(key="param_ties_lambda").value == pytest.approx(0.8)
    assert at.selectbox(key="merge_dtype").value == "F32"
    sel = at.session_state["ram_selection"]
    assert (sel.base, sel.agents) == ("demo:base", ("demo:tool", "demo:code")) and sel != before
    msg = [plain(s.value) for s in at.success if "Loaded" in plain(s.value)][0]
    assert "ties" in msg and "density=0.3" in msg and "2 agents" in msg
    code = [c.value for c in at.code if "merge_method" in plain(c.value)][0]
    assert "merge_method: ties" in code and "density: 0.3" in code and "out_dtype: float32" in code
    assert "demo:" not in code and str(demo_root() / "tool") in code  # mergekit reads folders, not demo: refs
    at.text_area(key="mk_text").set_value("base_model: demo:base\n").run()
    at.button(key="mk_load").click().run()
    assert not at.exception
    assert any("merge_method" in plain(e.value) for e in at.error)
    assert at.selectbox(key="merge_method").value == "ties"  # a bad YAML changes nothing


def test_fig3_experiment_runs_on_the_selected_models(env, monkeypatch):
    """The Signal dilution page runs Fig. 3 on the selected models in the background: real
    unique_only merges (whole and ÷ N) into a temporary folder, each scored on the agent's own task (the
    evaluator is replaced by one that reads the merge's recipe), with progress and cancel."""
    import pandas as pd

    pytest.importorskip("demo.evaluate")
    from demo import evaluate
    from merging.recipe import read_recipe

    calls, gate = [], threading.Event()
    gate.set()

    def scored(folder, tasks, split="test", limit=None):
        spec, _ = read_recipe(Path(folder))
        assert spec.method == "unique_only" and len(tasks) == 1
        calls.append((Path(folder), spec.params["agent"], spec.params["dilute"], tuple(tasks)))
        assert gate.wait(30)
        acc = 0.25 if spec.params["dilute"] else 0.5
        return pd.DataFrame({"task": tasks, "subset": ["all"], "n": [10], "correct": [int(10 * acc)],
                             "accuracy": [acc]})

    monkeypatch.setattr(evaluate, "evaluate_model", scored)
    at = new_app()
    at.switch_page("views/dilution.py").run()
    at.button(key="fig3_run").click().run()
    deadline = time.time() + 120
    while time.time() < deadline and not any(c.key == "chart_fig3_run" for c in at.get("plotly_chart")):
        assert not at.exception
        bars = at.get("progress")
        if bars:
            assert "Fig. 3 experiment: step" in bars[0].proto.text
        time.sleep(0.3)
        at.run()
    no_problems(at)
    agents = list(at.session_state["ram_selection"].agents)
    assert len(calls) == 2 * len(agents)
    assert {(a, d) for _, a, d, _ in calls} == {(str(i), d) for i in range(len(agents)) for d in (False, True)}
    labels = [ref.split(":")[-1] for ref in agents]  # demo:code → code, the task it was trained on
    assert all(task == (labels[int(a)],) for _, a, _, task in calls)
    assert not any(folder.exists() for folder, *_ in calls)  # the temporary merges are deleted
    fig = figure(at, "chart_fig3_run")
    bars = {t.name: list(t.y) for t in fig.data}
    assert bars["unique region only"] == pytest.approx([50.0] * len(agents))
    assert bars["unique region ÷ N"] == pytest.approx([25.0] * len(agents))

    gate.clear()  # now cancel one mid-way
    calls.clear()
    at.button(key="fig3_run").click().run()
    deadline = time.time() + 60
    while time.time() < deadline and not calls:
        time.sleep(0.2)
    at.run()
    at.button(key="fig3_cancel").click().run()
    gate.set()
    deadline = time.time() + 60
    while time.time() < deadline and not any("cancelled" in plain(i.value) for i in at.info):
        time.sleep(0.3)
        at.run()
    assert any("cancelled" in plain(i.value) for i in at.info)
    assert len(calls) == 1 and not calls[0][0].exists()


# --- Text from files is data, on every page ------------------------------------------------------

RAW_MARKUP = ("![", "](", "<img", "<a ", "<script", "www.evil.example", "%{x}", "$x$", ":red[", "\u202e")


def _outside_code_spans(markdown: str) -> str:
    """What Markdown could interpret: code spans (shown verbatim) and backslash-escaped characters removed."""
    import re

    return re.sub(r"\\[!-/:-@\[-`{-~]", "", re.sub(r"(`+) .*? \1", "", markdown))


def assert_no_markup(at: AppTest) -> None:
    """No element shows file-derived text as markup: every Markdown sink (outside code spans, where nothing is
    interpreted) holds it escaped, every plotly figure holds names as entities, the sidebar as HTML entities."""
    kinds = ("markdown", "caption", "error", "warning", "info", "success", "title", "subheader", "header")
    for kind in kinds:
        for el in at.get(kind):
            shown = _outside_code_spans(getattr(el, "value", "") or getattr(el.proto, "body", ""))
            assert not any(m in shown for m in RAW_MARKUP), (kind, shown[:400])
    for el in at.get("progress"):
        assert not any(m in _outside_code_spans(el.proto.text) for m in RAW_MARKUP), el.proto.text
    for table in at.table:
        cells = [_outside_code_spans(str(v)) for v in [*table.value.index, *table.value.to_numpy().ravel()]]
        assert not any(m in c for c in cells for m in RAW_MARKUP), cells[:10]
    for chart in at.get("plotly_chart"):
        texts: list[str] = []

        def strings(v) -> None:
            if isinstance(v, str):
                texts.append(v)
            elif isinstance(v, dict):
                for x in v.values():
                    strings(x)
            elif isinstance(v, list):
                for x in v:
                    strings(x)

        strings(json.loads(chart.proto.spec))
        bad = [t for t in texts if any(m in t for m in ("<img", "<a ", "<script", "$x$", "\u202e", "%{x} $"))]
        assert not bad, bad[:3]
    sidebar = "".join(h.proto.body for h in at.sidebar.get("html"))
    assert "<img" not in sidebar and "<a " not in sidebar and "<script" not in sidebar


def test_hostile_names_render_as_text_on_every_page(env, tmp_path):
    """A tensor name like `![x](http://host/b.png) [Click to fix](http://host/p)` was rendered as
    Markdown in the error box (a remote image, a phishing link); the same sink was in every st.markdown /
    caption / error, table, plotly title and hover. Folder and tensor names full of markup go through every page
    (charts, tables, the merge and its notes, error boxes) and stay text."""
    from tests.factory import make_hostile_family

    base, agents = make_hostile_family(tmp_path / "hostile")
    at = new_app()
    at.switch_page("views/models.py").run()
    at.radio(key="model_source").set_value("Custom: local folders or Hub ids").run()
    at.text_input(key="custom_base").set_value(str(base)).run()
    at.text_area(key="custom_agents").set_value("\n".join(map(str, agents))).run()
    at.button(key="use_models").click().run()
    no_problems(at)
    assert_no_markup(at)
    for page in ("views/heterogeneity.py", "views/tune.py", "views/dilution.py"):
        at.switch_page(page).run()
        no_problems(at)
        assert_no_markup(at)
    at.switch_page("views/heterogeneity.py").run()
    at.segmented_control(key="het_rho_by").set_value("tensor").run()  # the per-tensor table holds the tensor name
    no_problems(at)
    assert_no_markup(at)
    at.switch_page("views/merge.py").run()
    out = tmp_path / "out ![x](https:127.0.0.2:9) <img src=x>"
    at.text_input(key="merge_out").set_value(str(out)).run()
    at.button(key="start_merge").click().run()
    wait_merge(at)
    no_problems(at)
    assert any("Merged into" in plain(s.value) for s in at.success)
    assert_no_markup(at)
    # An error box quoting the hostile tensor name: an agent holding a NaN there.
    bad_base, bad_agents = make_hostile_family(tmp_path / "nan", nan_in=1)
    from app import state as app_state

    at.session_state[app_state.SEL_KEY] = app_state.Selection(str(bad_base), tuple(map(str, bad_agents)), "custom")
    at.switch_page("views/heterogeneity.py").run()
    assert not at.exception
    assert at.error and any("holds NaN" in plain(e.value) and "Click to fix" in plain(e.value) for e in at.error)
    assert_no_markup(at)


def test_an_alias_bomb_pasted_into_the_yaml_panel_is_refused_at_once(env):
    """A 553-byte YAML alias bomb pasted into the mergekit panel froze the whole server for 91 s."""
    bomb = "a: &a [" + ",".join(['"lol"'] * 9) + "]\n" + "".join(
        f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    at = new_app()
    at.switch_page("views/merge.py").run()
    at.text_area(key="mk_text").set_value(bomb).run()
    start = time.time()
    at.button(key="mk_load").click().run(timeout=30)
    assert time.time() - start < 30  # a guard against the old minutes, not a speed claim
    assert not at.exception
    assert any("alias" in plain(e.value) for e in at.error)


def test_overlap_panel_shows_the_diagnostics_next_to_chance(env):
    """The Heterogeneity page's "Is the overlap real?" panel draws what analysis.agreement computes:
    the pair matrix, where each agent's energy lies, the agent table with every chance value, the reading, and
    agreement per layer or module."""
    from analysis import agreement
    from app import state

    at = new_app().run()
    no_problems(at)
    assert "Is the overlap real?" in [h.value for h in at.subheader]
    from demo.table1 import evidence_for

    sel = state.demo_selection()
    res = state.cached_analysis(sel)
    scores = evidence_for(sel.base, list(sel.agents))  # the demo trio's committed Table 1, cited by the reading
    assert scores.startswith("Measured on these models (the demo's mini Table 1 of `demo:`")
    read = agreement.reading(res, 1e-5, scores)
    assert read.regime == "chance"  # the bundled demo: coincidental overlap
    assert [w.value for w in at.warning if "chance" in w.value] == [agreement.markdown_text(read.text)]
    pa = agreement.pair_agreement(res, 1e-5)
    matrix = figure(at, "chart_overlap_pair_matrix")
    cells = {t for trace in matrix.data for row in trace.text for t in row}
    for r in pa.itertuples():
        assert f"{100 * r.sign_agreement:.1f}%" in cells and f"{r.cosine:+.3f}" in cells
    energy = figure(at, "chart_overlap_energy_profile")
    totals = [sum(t.x[i] for t in energy.data) for i in range(len(res.agents))]
    assert totals == pytest.approx([100.0] * len(res.agents))
    ag = agreement.agent_agreement(res, 1e-5).set_index("agent")
    unique = next(t.x for t in energy.data if t.name.startswith("unique"))
    assert list(unique) == pytest.approx([100 * (1 - ag.loc[a, "shared_energy_share"]) for a in res.agents])
    table = next(df.value for df in at.dataframe if "chance (per tensor)" in df.value.columns)
    assert {"same sign (pairs)", "chance", "all agree", "chance (all agree)", "cosine vs others", "partners < 10 %",
            "partners < 30 %", "chance (model)"} <= set(table.columns)
    layer = figure(at, "chart_overlap_agreement_by_layer")
    # The legend stands beside the plot or above it, under the title (never on a title or the plot)
    assert len(layer.data) == 2 * len(pa) and legend_off_the_plot(layer.layout)
    at.segmented_control(key="het_agree_by").set_value("module").run()
    no_problems(at)
    assert figure(at, "chart_overlap_agreement_by_module").data[0].type == "bar"


def test_overlap_panel_with_the_papers_long_names(env, tmp_path):
    """Agents named like the paper's (ReasonFlux-Coder-7B, Qwen2.5-7B-Instruct-ToolRL-grpo-cold,
    RL-MemoryAgent-7B): the charts use short labels and keep the full names in their hover texts."""
    import shutil

    from merging.reading.refs import BUNDLED_DEMO_ROOT
    from tests.make_screenshots import PAPER_NAMES

    folders = {k: shutil.copytree(BUNDLED_DEMO_ROOT / k, tmp_path / v) for k, v in PAPER_NAMES.items()}
    at = new_app().run()
    use_models(at, str(folders["base"]), [str(folders[k]) for k in ("code", "tool", "memory")])
    at.switch_page("views/heterogeneity.py").run()
    no_problems(at)
    matrix = figure(at, "chart_overlap_pair_matrix")
    labels = [x.replace("<br>", "") for x in matrix.data[0].x]  # long ones wrap onto two lines
    assert labels == ["ReasonFlux-Coder", "Qwen2.5…grpo-cold", "RL-MemoryAgent"]
    assert all(len(x) <= 20 for x in labels)
    hovers = " ".join(h for row in matrix.data[0].customdata for h in row)
    assert all(name in hovers for name in (PAPER_NAMES["code"], PAPER_NAMES["tool"], PAPER_NAMES["memory"]))
    energy = figure(at, "chart_overlap_energy_profile")
    assert legend_off_the_plot(energy.layout) and list(energy.data[0].customdata) == [PAPER_NAMES[k] for k in
                                                                                      ("code", "tool", "memory")]


def test_presets_on_tune_and_merge(env, tmp_path):
    """The authors' script's modes as presets — Tune sets r, α and the rule from them (λ_t as the script
    computes it), moving a control makes the setting custom; Merge fills its form from the preset, and the card
    and recipe of the merge name the preset and R."""
    import json

    from app import state
    from merging.methods.regions import lambda_for

    at = new_app().run()
    at.switch_page("views/tune.py").run()
    at.selectbox(key="tune_preset").set_value("authors-default").run()
    no_problems(at)
    assert at.slider(key="tune_r").value == pytest.approx(0.05) and at.slider(key="tune_alpha").value == 1.0
    at.number_input(key="tune_rescale").set_value(1.2).run()
    no_problems(at)
    assert at.slider(key="tune_r").value == pytest.approx(0.2) and at.radio(key="tune_rule").value == "clip"
    res = state.cached_analysis(state.demo_selection())
    counts = res.counts_at(1e-5)
    script = [1 + 0.2 * min(1.0, s / u) for s, u in zip(counts["shared"], counts["unique"])]  # arm-r-v2, R = 1.2
    assert [float(v) for v in lambdas(at)] == pytest.approx(script, abs=5e-5)  # the table shows 4 decimals
    at.selectbox(key="tune_preset").set_value("authors-soft").run()
    assert at.radio(key="tune_rule").value == "soft"
    at.selectbox(key="tune_preset").set_value("authors-default").run()
    at.switch_page("views/merge.py").run()
    no_problems(at)
    assert at.selectbox(key="merge_preset").value == "authors-default"
    assert at.selectbox(key="merge_method").value == "ram_plus"
    assert at.number_input(key="param_ram_plus_r").value == pytest.approx(0.2)
    assert at.number_input(key="param_ram_plus_alpha").value == 1.0
    out = tmp_path / "preset-merge"
    at.text_input(key="merge_out").set_value(str(out)).run()
    at.button(key="start_merge").click().run()
    wait_merge(at)
    no_problems(at)
    card = (out / "README.md").read_text()
    assert "Preset authors-default with R = 1.2" in card and "Is the overlap real?" in card
    recipe = json.loads((out / "ram_recipe.json").read_text())
    assert recipe["preset"]["rescale_factor"] == pytest.approx(1.2)
    assert [row["lambda"] for row in recipe["lambdas"]] == pytest.approx(
        [lambda_for(s, u, 0.2, 1.0) for s, u in zip(counts["shared"], counts["unique"])])
    at.switch_page("views/tune.py").run()
    at.slider(key="tune_r").set_value(0.3).run()
    assert at.selectbox(key="tune_preset").value == "custom"  # moved by hand: no longer the preset


def _table1(folder: Path, ram: float, ta: float) -> None:
    import pandas as pd

    folder.mkdir(parents=True)
    pd.DataFrame({"model": ["base", "code", "tool", "memory", "average", "task_arithmetic", "ram", "ram_plus"],
                  "params": ["", "", "", "", "", "lambda=1.0", "eps=1e-05", "r=0.1"],
                  "code": [10.0, 30.0, 10.0, 10.0, 15.0, ta, ram, ram - 1],
                  "tool": [10.0, 10.0, 40.0, 10.0, 15.0, ta, ram, ram - 1],
                  "memory": [10.0, 10.0, 10.0, 50.0, 15.0, ta, ram, ram - 1],
                  "avg": [10.0, 16.67, 20.0, 23.33, 15.0, ta, ram, ram - 1], "avg_se": [1.0] * 8,
                  "val_avg": [10.0, 16.0, 20.0, 23.0, 15.0, ta, ram, ram - 1]}).to_csv(folder / "table1.csv",
                                                                                       index=False)


def test_dilution_two_regimes_side_by_side(tmp_path, monkeypatch):
    """Both demo trios' Table 1 and shared-region diagnostics side by side, each with a reading computed
    from its own numbers, and one sentence across the two; a trio that is not built is said so."""
    from tests.app_helpers import build_demo

    build_demo(tmp_path / "a" / "models")
    build_demo(tmp_path / "b" / "models-shared")
    _table1(tmp_path / "a" / "results", ram=30.0, ta=40.0)
    _table1(tmp_path / "b" / "results-shared", ram=45.0, ta=40.0)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in app_env(tmp_path, use_real_demo=False).items():
            mp.setenv(k, v)
        mp.setenv("RAM_STUDIO_DEMO_ROOT", str(tmp_path / "a" / "models"))
        mp.setenv("RAM_STUDIO_DEMO_SHARED_ROOT", str(tmp_path / "b" / "models-shared"))
        st.cache_resource.clear()
        at = new_app()
        at.switch_page("views/dilution.py").run()
        no_problems(at)
        frames = [d.value for d in at.dataframe][-6:]  # per trio (left, then right): Table 1, pairs, agents
        for table, ram in ((frames[0], 30.0), (frames[3], 45.0)):  # scores ± standard error
            assert table.loc["ram", "avg"] == f"{ram:.2f} ± 1.00" and table.loc["task_arithmetic",
                                                                                "avg"] == "40.00 ± 1.00"
        assert all(sorted(f["agent"]) == ["code", "memory", "tool"] for f in (frames[2], frames[5]))
        pairs = frames[1]
        assert list(pairs["pair"]) == ["code–memory", "code–tool", "memory–tool"]
        from app.charts import pct
        assert set(pairs["chance"]) == {pct(0.5)}
        text = " ".join(plain(m.value) for m in at.markdown)
        # judged against the noise: no paired comparisons here, so √(1.0² + 1.0²) = 1.4 points
        assert "RAM (30.0 ± 1.0) trails task arithmetic (40.0 ± 1.0) by 10.0 ± 1.4 points (unpaired)" in text
        assert "RAM (45.0 ± 1.0) beats task arithmetic (40.0 ± 1.0) by 5.0 ± 1.4 points (unpaired)" in text
        assert "RAM is behind task arithmetic (-10.0 ± 1.4 points)" in text
        assert "RAM is ahead of task arithmetic (+5.0 ± 1.4 points)" in text
        assert "Reading across the two trios" in text
        assert "Shared updates" in text or "changed elements per pair" in text  # the diagnostics' own reading

        mp.setenv("RAM_STUDIO_DEMO_SHARED_ROOT", str(tmp_path / "nothing"))
        st.cache_resource.clear()
        at = new_app()
        at.switch_page("views/dilution.py").run()
        no_problems(at)
        assert any("Not here yet: `demo-shared:`" in plain(c.value) for c in at.caption)
        assert "Reading across the two trios" not in " ".join(plain(m.value) for m in at.markdown)
    st.cache_resource.clear()
def all_figures(at: AppTest) -> dict:
    """Every plotly chart on the page, by key, decoded."""
    return {c.key: figure(at, c.key) for c in at.get("plotly_chart")}


def check_names_in_chart(key: str, fig, full: list[str]) -> None:
    """One rule for every chart: no long name on an axis or in a legend (short names, ≤ 20 characters,
    wrapped onto ≤ 2 lines), the legend beside the plot or above it (never over the plot or the title), the full
    names on hover."""
    import re

    from app import charts

    short = charts.short_labels(full)
    text = json.dumps(fig.to_plotly_json(), ensure_ascii=False)

    def visible(v: str) -> str:
        return re.sub(r"<[^>]+>", "", str(v))

    for tr in fig.data:
        for axis in ("x", "y"):
            values = getattr(tr, axis, None)
            if values is None or tr.type not in ("bar", "heatmap", "scatter"):
                continue
            for v in values:
                if isinstance(v, str):
                    assert all(name not in v for name in full if len(name) > 20), (key, v)
                    assert all(len(visible(line)) <= 20 for line in v.split("<br>")) and v.count("<br>") <= 1, (key, v)
        if tr.showlegend is not False and tr.name:
            assert len(visible(tr.name)) <= 45 and all(n not in tr.name for n in full if len(n) > 20), (key, tr.name)
    shown = [tr for tr in fig.data if tr.showlegend is not False and tr.name]
    if shown and fig.layout.showlegend is not False:
        assert legend_off_the_plot(fig.layout), (key, fig.layout.legend)
    for a in fig.layout.annotations or []:
        assert all(n not in a.text for n in full if len(n) > 20), (key, a.text)
    if any(s in text for s in short.values() if s not in ("code", "tool", "memory")):
        assert all(n in text for n in full), (key, "full names on hover")


def test_every_chart_with_the_papers_long_names(env, tmp_path):
    """With the paper's model names every chart on every page keeps short labels on its axes and in
    its legend, full names on hover, and its legend beside or above the plot; the rendered geometry (no overlap,
    titles not cut) is checked in chromium by tests/browser/test_chart_layout.py."""
    from merging.reading.refs import BUNDLED_DEMO_ROOT
    from tests.make_screenshots import PAPER_NAMES

    folders = {k: shutil.copytree(BUNDLED_DEMO_ROOT / k, tmp_path / v) for k, v in PAPER_NAMES.items()}
    full = [PAPER_NAMES[k] for k in ("code", "tool", "memory")]
    at = new_app().run()
    use_models(at, str(folders["base"]), [str(folders[k]) for k in ("code", "tool", "memory")])
    seen = set()
    at.switch_page("views/heterogeneity.py").run()
    no_problems(at)
    for by, what in [("layer", "ρ"), ("module", "ρ"), ("module", "λ"), ("layer × module", "λ"), ("layer", "λ")]:
        at.segmented_control(key="het_rho_by").set_value(by).run()
        at.segmented_control(key="het_rho_what").set_value(what).run()
        no_problems(at)
        for key, fig in all_figures(at).items():
            check_names_in_chart(key, fig, full)
            seen.add(key)
    for page in ("views/tune.py", "views/dilution.py"):
        at.switch_page(page).run()
        no_problems(at)
        for key, fig in all_figures(at).items():
            check_names_in_chart(key, fig, full)
            seen.add(key)
    assert {"chart_density_per_agent", "chart_overlap_distribution", "chart_unique_vs_chance",
            "chart_norms_and_sign_conflicts", "chart_density_layer_module", "chart_unique_shared_by_layer",
            "chart_eps_sensitivity", "chart_rho_by_module", "chart_lambda_by_layer_module", "chart_lambda_curve",
            "chart_signal_retention", "chart_compare_a_b"} <= seen, seen


def test_tune_survival_chart_uses_the_task_arithmetic_lambda_of_the_merge_form(env):
    """The chart of "how much of each agent's unique update survives" shows task arithmetic at the λ chosen
    on the Merge form (or Tune's slider), not at 1/N, and says which λ in its caption."""
    at = new_app().run()
    at.switch_page("views/tune.py").run()
    no_problems(at)

    def ta_bars(fig) -> list[float]:
        i = [m.replace("<br>", "") for m in fig.data[0].customdata].index("task arithmetic (λ=1)") \
            if any("λ=1)" in m for m in fig.data[0].customdata) else None
        return [t.y[i] for t in fig.data] if i is not None else []

    fig = figure(at, "chart_signal_retention")
    assert ta_bars(fig) == pytest.approx([100.0] * len(fig.data))  # the method's default λ = 1.0, not 1/N
    caption = " ".join(plain(c.value) for c in at.caption)
    assert "task arithmetic keeps λ = 1 of it" in caption and "λ = 1/3 would be averaging" in caption
    at.switch_page("views/merge.py").run()
    at.selectbox(key="merge_method").set_value("task_arithmetic").run()
    at.number_input(key="param_task_arithmetic_lambda").set_value(0.7).run()
    no_problems(at)
    at.switch_page("views/tune.py").run()
    no_problems(at)
    assert at.slider(key="tune_ta_lambda").value == pytest.approx(0.7)
    fig = figure(at, "chart_signal_retention")
    methods = [m.replace("<br>", "") for m in fig.data[0].customdata]
    i = methods.index("task arithmetic (λ=0.7)")
    assert [t.y[i] for t in fig.data] == pytest.approx([70.0] * len(fig.data))
    assert "(the Merge form's λ (0.7)" in " ".join(plain(c.value) for c in at.caption)
    at.slider(key="tune_ta_lambda").set_value(1.5).run()
    fig = figure(at, "chart_signal_retention")
    methods = [m.replace("<br>", "") for m in fig.data[0].customdata]
    assert [t.y[methods.index("task arithmetic (λ=1.5)")] for t in fig.data] == pytest.approx([150.0] * len(fig.data))
    assert "λ = 1.5 of it (the slider above" in " ".join(plain(c.value) for c in at.caption)


def test_tables_fit_tensor_scope_lambda_table_and_show_path_ends(env, tmp_path):
    """Under tensor scope Tune's 7-column λ table takes the page's width (not half of it);
    the Models page shows a long path by its end, in a column as wide as its text."""
    from merging.reading.refs import BUNDLED_DEMO_ROOT

    at = new_app().run()
    at.switch_page("views/tune.py").run()
    at.radio(key="tune_scope").set_value("tensor").run()
    no_problems(at)
    wide = [t for t in at.table if "λ range (tensors)" in t.value.columns]
    assert wide and list(wide[0].value.columns)[-1] == "λ range (tensors)"
    assert not any("λ range (tensors)" in t.value.columns for col in at.columns for t in col.table)
    at.radio(key="tune_scope").set_value("global").run()
    # global: above λ(ρ) in the narrowest window (no width measured yet), beside it when the column has room
    assert not any("λ_t" in t.value.columns for col in at.columns for t in col.table)
    assert any("λ_t" in t.value.columns for t in at.table)
    from app.viewport import WIDTH_KEY

    at.session_state[WIDTH_KEY] = 1200  # what the page's browser component reports in a wide window
    at.run()
    assert any("λ_t" in t.value.columns for col in at.columns for t in col.table)

    deep = tmp_path / "checkpoints" / "qwen" / "runs" / "2026-11-24-with-a-long-run-name"
    folders = {k: shutil.copytree(BUNDLED_DEMO_ROOT / k, deep / v) for k, v in
               {"base": "Qwen2.5-7B-Instruct", "code": "ReasonFlux-Coder-7B",
                "tool": "Qwen2.5-7B-Instruct-ToolRL-grpo-cold"}.items()}
    use_models(at, str(folders["base"]), [str(folders["code"]), str(folders["tool"])])
    at.switch_page("views/models.py").run()
    no_problems(at)
    models = next(d for d in at.dataframe if "source" in d.value.columns)
    sources = list(models.value["source"])
    from app.tables import PATH_CHARS

    # by its end, cut at a "/" so the last folder's name stays whole
    assert all(s.startswith("…/") and len(s) <= PATH_CHARS for s in sources)
    assert [s.rsplit("/", 1)[-1] for s in sources] == ["Qwen2.5-7B-Instruct", "ReasonFlux-Coder-7B",
                                                       "Qwen2.5-7B-Instruct-ToolRL-grpo-cold"]
    config = json.loads(models.proto.columns)
    assert config["source"]["width"] >= 28 + 7.5 * max(len(s) for s in sources)

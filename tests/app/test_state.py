"""What survives a reload, the mergekit panel, the forms' labels, the app's small points. The selection lives in the
URL's query parameters (validated, shown escaped), a new session re-attaches to the server's running or finished job
(AppTest; the browser test with a real reload is in tests/browser/test_app_end_to_end.py)."""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest

from tests.app_helpers import figure, new_app, no_problems, plain, wait_merge

pytestmark = pytest.mark.timeout(240)


def url(at) -> tuple[list[str], list[str]]:
    q = at.query_params
    listed = lambda v: v if isinstance(v, list) else [v]  # noqa: E731
    return listed(q.get("base", [])), listed(q.get("agent", []))


def test_the_selection_goes_into_the_url_and_a_link_opens_it(env):
    at = new_app().run()
    no_problems(at)
    sel = at.session_state["ram_selection"]
    assert url(at) == ([sel.base], list(sel.agents))  # the demo, written out: a bookmark names its models
    at.switch_page("views/tune.py").run()  # every page keeps them
    assert url(at) == ([sel.base], list(sel.agents))

    link = new_app()  # a new session from a link naming two agents in another order
    link.query_params["base"] = "demo:base"
    link.query_params["agent"] = ["demo:tool", "demo:code"]
    link.run()
    no_problems(link)
    opened = link.session_state["ram_selection"]
    assert (opened.base, opened.agents, opened.source) == ("demo:base", ("demo:tool", "demo:code"), "demo")
    assert url(link) == (["demo:base"], ["demo:tool", "demo:code"])
    assert any(plain(m.value) == "Agents" or "Agents" in plain(m.value) for m in link.sidebar.markdown)


def test_a_link_reuses_the_servers_cached_analysis(env, monkeypatch):
    first = new_app()
    first.query_params.update({"base": "demo:base", "agent": ["demo:memory", "demo:code"]})
    first.run()
    no_problems(first)
    assert len(first.get("plotly_chart")) >= 5

    import analysis.stats

    def never(*_a, **_k):
        raise AssertionError("the analysis was computed again")

    monkeypatch.setattr(analysis.stats, "analyze", never)
    again = new_app()  # a reload: a new session, the same URL
    again.query_params.update(first.query_params)
    again.run()
    no_problems(again)
    assert len(again.get("plotly_chart")) >= 5
    assert any("analysis ready" in plain(c.value) for c in again.sidebar.caption)


@pytest.mark.parametrize("params, why", [
    ({"base": "demo:base", "agent": ["demo:../../..", "demo:code"]}, "unknown demo model"),
    ({"base": "demo:base", "agent": ["demo:code"]}, "between 2 and"),
    ({"agent": ["demo:code", "demo:tool"]}, "no base model"),
    ({"base": ["demo:base", "demo:code"], "agent": ["demo:code", "demo:tool"]}, "more than one base"),
    ({"base": "demo:base", "agent": ["demo:code", "x" * 600]}, "too long"),
    ({"base": "demo:base", "agent": ["demo:code", "evil\u202e\x1b[31m"]}, "control characters"),
    ({"base": "[click](http://evil.example) <b>x</b>", "agent": ["demo:code", "demo:tool"]}, "does not exist"),
])
def test_a_bad_link_is_said_once_escaped_and_opens_the_demo(env, params, why):
    at = new_app()
    at.query_params.update(params)
    at.run()
    assert not at.exception
    warnings = [w for w in at.warning if "were not opened" in plain(w.value)]
    assert len(warnings) == 1 and why in plain(warnings[0].value), [plain(w.value) for w in at.warning]
    raw = warnings[0].value
    assert "](http" not in raw and "<b>" not in raw and "\x1b" not in raw and "\u202e" not in raw
    sel = at.session_state["ram_selection"]
    assert sel.source == "demo" and url(at) == ([sel.base], list(sel.agents))  # the URL now names what is shown
    at.switch_page("views/models.py").run()
    assert not at.exception
    at.radio(key="model_source").set_value("Bundled demo").run()
    at.button(key="use_models").click().run()
    at.run()
    assert not [w for w in at.warning if "were not opened" in plain(w.value)]  # gone once models are chosen


def test_choosing_models_updates_the_url(env):
    at = new_app()
    at.switch_page("views/models.py").run()
    at.radio(key="model_source").set_value("Custom: local folders or Hub ids").run()
    at.text_input(key="custom_base").set_value("demo:base").run()
    at.text_area(key="custom_agents").set_value("demo:memory\ndemo:tool").run()
    at.button(key="use_models").click().run()
    no_problems(at)
    assert url(at) == (["demo:base"], ["demo:memory", "demo:tool"])


def gated_runner(gate: threading.Event):
    def gated(spec, *, overwrite, counts, overlap, provenance, progress, cancel, count_progress):
        from merging.common.errors import MergeCancelled

        gate.set()
        cancel.wait(60)
        raise MergeCancelled()
    return gated


@pytest.fixture
def sessions(monkeypatch):
    """AppTest gives every app the same session id: name them, so that ownership is what a server sees."""
    from app import jobs

    who = {"id": "first", "gone": set()}
    monkeypatch.setattr(jobs, "session_id", lambda: who["id"])
    monkeypatch.setattr(jobs, "session_alive", lambda sid: sid not in who["gone"])
    return who


def reload_as(sessions: dict, at, *, keep_url: bool = True):
    """A reload: the old session is gone, a new one opens the Merge page (on the same URL, or the bare one)."""
    sessions["gone"].add(sessions["id"])
    sessions["id"] = f"session-{len(sessions['gone'])}"
    new = new_app()
    if keep_url:
        new.query_params.update(at.query_params)
    return new.switch_page("views/merge.py").run()


@contextlib.contextmanager
def gated_merge(out: Path):
    """A session that started a merge into `out` whose job waits on a gate (so it stays running): yields the
    session and the job manager; the manager's submit is restored afterwards."""
    from unittest import mock

    from app import jobs

    gate = threading.Event()
    first = new_app()
    first.switch_page("views/merge.py").run()
    first.text_input(key="merge_out").set_value(str(out)).run()
    with mock.patch("merging.merge.merge_to_folder", gated_runner(gate)):  # what the page's merge job runs
        first.button(key="start_merge").click().run()
        assert gate.wait(10)
    yield first, jobs.manager()


@pytest.mark.parametrize("keep_url", [True, False], ids=["reload", "bare-url"])
def test_a_reload_reattaches_to_the_running_merge_and_can_cancel_it(env, tmp_path, sessions, keep_url):
    with gated_merge(tmp_path / "c") as (first, mgr):
        job_id = first.session_state["merge_job"]
        assert first.query_params.get("job") in (job_id, [job_id])  # the URL names the job

        reloaded = reload_as(sessions, first, keep_url=keep_url)
        assert not reloaded.exception
        assert not any("Busy" in plain(w.value) for w in reloaded.warning)  # it is this session's merge now
        assert reloaded.button(key="start_merge").disabled
        cancel = reloaded.button(key="cancel_merge")
        assert not cancel.disabled and mgr.get(job_id).owner == sessions["id"]
        cancel.click().run()
        wait_merge(reloaded, 20)
        assert any("cancelled" in plain(i.value) for i in reloaded.info)
    assert mgr.running() is None and not (tmp_path / "c").exists()


def test_a_reload_shows_the_finished_merge_and_owns_its_folder(env, tmp_path, sessions):
    out = tmp_path / "merged"
    first = new_app()
    first.switch_page("views/merge.py").run()
    first.text_input(key="merge_out").set_value(str(out)).run()
    first.button(key="start_merge").click().run()
    wait_merge(first)
    no_problems(first)

    reloaded = reload_as(sessions, first)
    no_problems(reloaded)
    assert any("Merged into" in plain(s.value) for s in reloaded.success)  # the results came back
    assert {"Model card", "Recipe"} <= {b.label for b in reloaded.get("download_button")}
    # the folder is this session's own now: overwriting it is allowed (not "written by another session")
    reloaded.text_input(key="merge_out").set_value(str(out)).run()
    reloaded.checkbox(key="merge_overwrite").check().run()
    reloaded.button(key="start_merge").click().run()
    wait_merge(reloaded)
    no_problems(reloaded)
    assert any("Merged into" in plain(s.value) for s in reloaded.success)
    assert (out / "README.md").exists()


def test_a_connected_sessions_merge_is_not_taken_over(env, tmp_path, sessions):
    """A second tab (its own session, the first still open) sees the merge as busy, without its cancel."""
    with gated_merge(tmp_path / "c") as (first, mgr):
        try:
            sessions["id"] = "second-tab"
            other = new_app().switch_page("views/merge.py").run()
            assert any("Busy" in plain(w.value) for w in other.warning)
            assert not other.button(key="start_merge").disabled \
                and mgr.get(first.session_state["merge_job"]).owner == "first"
        finally:
            mgr.cancel(first.session_state["merge_job"], "first")
    wait_merge(first, 20)


def test_a_job_id_in_the_url_is_untrusted(env):
    at = new_app()
    at.query_params["job"] = ["../../etc", "<script>", "0123456789abcdef" * 4]
    at.switch_page("views/merge.py").run()
    no_problems(at)
    assert "merge_job" not in at.session_state


def test_only_a_gone_sessions_job_is_adopted():
    """The page opened by its URL without `?job=` (a new tab, a typed address) takes over the newest job whose
    session has gone, never one a connected session still follows."""
    from app.jobs import JobManager

    mgr = JobManager()
    gate = threading.Event()
    old = mgr.submit("fig3", "gone", "an old experiment", lambda j: gate.wait(10), exclusive=False)
    live = mgr.submit("fig3", "open-tab", "a live experiment", lambda j: gate.wait(10), exclusive=False)
    live.started = old.started + 1
    try:
        assert mgr.orphan("fig3", lambda owner: owner == "open-tab") is old
        assert mgr.orphan("sweep", lambda owner: False) is None
        assert not mgr.adopt(live.id, "new", lambda owner: owner == "open-tab") and live.owner == "open-tab"
        assert mgr.adopt(old.id, "new", lambda owner: owner == "open-tab") and old.owner == "new"
    finally:
        gate.set()
        old.thread.join(10)
        live.thread.join(10)
    assert old.status == "done"  # finished: only a link naming it (?job=) re-attaches to it
    assert mgr.orphan("fig3", lambda owner: False) is None


def test_a_reordered_analysis_equals_a_fresh_pass_in_that_order(env):
    """The same models in another order are the same analysis: reordering a result gives exactly
    what a new pass over the weights in that order computes."""
    import pandas as pd

    from analysis.ladder import DEFAULT_LADDER
    from analysis.stats import analyze

    first = analyze("demo:base", ["demo:code", "demo:memory", "demo:tool"], ladder=DEFAULT_LADDER, use_cache=False)
    order = ["demo:base", "demo:tool", "demo:code", "demo:memory"]
    fresh = analyze(order[0], order[1:], ladder=DEFAULT_LADDER, use_cache=False)
    moved = first.reordered(order)
    assert moved.agents == fresh.agents == ["tool", "code", "memory"] and moved.refs == order
    pd.testing.assert_frame_equal(moved.frame, fresh.frame, check_exact=False, rtol=1e-9)
    pd.testing.assert_frame_equal(moved.pairs, fresh.pairs, check_exact=False, rtol=1e-9)
    assert first.reordered(["demo:base", "demo:tool", "demo:code"]) is None  # another set: a new pass
    assert first.reordered(["demo:tool", "demo:base", "demo:code", "demo:memory"]) is None


YAML_REORDERED = ("merge_method: ram\nbase_model: demo:base\nmodels:\n  - model: demo:tool\n  - model: demo:memory\n"
                  "  - model: demo:code\nparameters:\n  epsilon: 1e-5\n")


def test_a_yaml_with_the_same_models_in_another_order_keeps_the_analysis_and_says_so(env, tmp_path):
    at = new_app().run()  # the demo, analysed on Heterogeneity
    no_problems(at)
    at.switch_page("views/merge.py").run()
    out = tmp_path / "m"
    at.text_input(key="merge_out").set_value(str(out)).run()
    at.button(key="start_merge").click().run()
    wait_merge(at)  # a finished merge puts its results above nothing, but notes and captions move around
    assert any("analysis ready" in plain(c.value) for c in at.sidebar.caption)
    at.text_area(key="mk_text").set_value(YAML_REORDERED).run()
    at.button(key="mk_load").click().run()
    no_problems(at)
    assert at.session_state["mk_panel"] is True  # the panel stays open after the load
    msg = [plain(s.value) for s in at.success if "Loaded" in plain(s.value)]
    assert len(msg) == 1 and "now in the YAML's order" in msg[0] and "analysis is kept" in msg[0], msg
    sel = at.session_state["ram_selection"]
    assert sel.agents == ("demo:tool", "demo:memory", "demo:code")  # the merge follows the YAML, said above
    assert any("analysis ready" in plain(c.value) for c in at.sidebar.caption)  # not dropped
    assert any("Merged into" in plain(s.value) for s in at.success)  # the finished merge is still shown
    at.text_area(key="mk_text").set_value(YAML_REORDERED.replace("demo:memory", "demo:code").replace(
        "  - model: demo:code\nparameters", "parameters")).run()
    at.button(key="mk_load").click().run()
    msg = [plain(s.value) for s in at.success if "Loaded" in plain(s.value)]
    assert "now the selected models" in msg[0], msg  # another set of models: said as such


def test_merge_form_and_tune_show_the_declared_labels(env):
    """One label per parameter, declared with it, on the Merge form and on Tune alike."""
    from merging.methods import METHODS

    at = new_app()
    at.switch_page("views/tune.py").run()
    no_problems(at)
    declared = {p.name: p.title for p in METHODS["ram_plus"].params}
    assert declared == {"eps": "ε (changed when |τ| > ε)", "r": "r (rescale strength)", "alpha": "α (clip bound on ρ)",
                        "rho_scope": "ρ scope", "count_tied_twice": "count tied ×2",
                        "eps_steps": "ε in steps of the stored dtype (0: absolute ε)"}
    assert at.select_slider(key="tune_eps").label == declared["eps"]
    assert at.slider(key="tune_r").label == declared["r"] and at.slider(key="tune_alpha").label == declared["alpha"]
    assert at.radio(key="tune_scope").label == declared["rho_scope"]
    at.switch_page("views/merge.py").run()
    for name in METHODS:
        at.selectbox(key="merge_method").set_value(name).run()
        no_problems(at)
        for p in METHODS[name].params:
            widget = next(w for kind in ("number_input", "selectbox", "checkbox", "text_input")
                          for w in at.get(kind) if getattr(w, "key", None) == f"param_{name}_{p.name}")
            assert widget.label == p.title, (name, p.name, widget.label)
            assert "_" not in widget.label  # never a Python name such as rho_scope or drop_rate


def test_soft_rule_subtitles_name_no_alpha(env):
    at = new_app()
    at.switch_page("views/tune.py").run()
    assert "α = 2 · rule = clip · ρ scope = global" in figure(at, "chart_lambda_curve").layout.title.text  # clip: α
    at.radio(key="tune_rule").set_value("soft").run()
    no_problems(at)
    for key in ("chart_lambda_curve", "chart_signal_retention"):
        title = figure(at, key).layout.title.text
        assert "rule = soft" in title and "α" not in title and "alpha" not in title, title
    at.switch_page("views/heterogeneity.py").run()
    no_problems(at)
    shown = [plain(c.value) for c in at.caption if "rule" in plain(c.value) and "r = " in plain(c.value)]
    assert shown and all("α" not in c and "soft rule" in c for c in shown), shown
    at.switch_page("views/tune.py").run()
    at.radio(key="tune_rule").set_value("clip").run()  # the next tests start from the default


def test_toy_titles_are_in_the_themes_ink(env):
    """The toy's agent colours mark their panels with a square; the title text is the theme's ink, so a dark A3
    on the dark theme and a pale A5 on white stay readable."""
    import re

    from app import charts

    at = new_app()
    at.switch_page("views/dilution.py").run()
    at.slider(key="toy_n").set_value(5).run()  # A1…A5: the dark A3 and the pale A5 among them
    heat = figure(at, "chart_toy_heatmaps")
    titles = [a.text for a in heat.layout.annotations if "τ of" in (a.text or "")]
    assert len(titles) == 5
    for text in titles:
        coloured = re.findall(r"<span style='color:([^']+)'>([^<]*)</span>", text)
        assert [glyph for _, glyph in coloured] == ["■"], text  # only the square takes the agent's colour
        assert coloured[0][0] in charts.TOY_PALETTE
        assert "<b>τ of" in text and "<b style" not in text


def test_fig3_duration_is_estimated_from_the_model_size(env):
    at = new_app()
    at.switch_page("views/dilution.py").run()
    no_problems(at)
    text = " ".join(plain(m.value) for m in at.markdown if "Run it on the selected models" in plain(m.value))
    assert "estimated from the models' size" in text and "parameters" in text and "a few minutes" not in text, text


def test_an_offline_preset_error_is_shown_once(env):
    at = new_app()
    at.switch_page("views/models.py").run()
    at.radio(key="model_source").set_value(next(o for o in at.radio(key="model_source").options if "Qwen" in o)).run()
    at.button(key="check_compat").click().run()
    at.button(key="use_models").click().run()
    assert not at.exception
    boxes = [plain(e.value) for e in at.error]  # the report's one box also says that nothing was selected
    assert len(boxes) == 1 and "were not selected" in boxes[0] and "could not be read" in boxes[0], boxes
    fresh = new_app()  # without the check first: one box says both
    fresh.switch_page("views/models.py").run()
    qwen = next(o for o in fresh.radio(key="model_source").options if "Qwen" in o)
    fresh.radio(key="model_source").set_value(qwen).run()
    fresh.button(key="use_models").click().run()
    boxes = [plain(e.value) for e in fresh.error]
    assert len(boxes) == 1 and "were not selected" in boxes[0] and "could not be read" in boxes[0], boxes

"""The app's background jobs (app/jobs.py): one record for every kind, one submit with the server's rules (one merge
at a time, one job of a kind, a folder belongs to its session), cancel by the owner only, finished records within
their memory limit — and, through the pages (AppTest), a job's link followed read-only while its session is open."""
from __future__ import annotations

import contextlib
import resource
import threading
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from app.jobs import READ_ONLY, Busy, JobManager
from merging.common.errors import Cancelled, RamStudioError
from tests.app_helpers import new_app, no_problems, plain, wait_merge

MB = 1_000_000


def finish(job, seconds: float = 20):
    job.thread.join(seconds)
    assert not job.running, f"{job.label} still running"
    return job


def held(gate: threading.Event):
    """Work that runs until `gate` opens (or the job is cancelled)."""
    def work(job):
        while not gate.wait(0.05):
            if job.cancel.is_set():
                raise Cancelled("stopped on request.")
        return "finished"
    return work


# ---------------------------------------------------------------- the record and its rules

def test_every_kind_of_job_is_one_record_with_progress_result_and_timing():
    mgr = JobManager()

    def work(job):
        job.report(0.5, "half way", {"examples": 10})
        return {"score": 42}

    job = finish(mgr.submit("eval", "me", "an evaluation", work, exclusive=False, key="/models/a"))
    assert (job.kind, job.owner, job.label, job.status, job.result) == ("eval", "me", "an evaluation", "done",
                                                                         {"score": 42})
    assert (job.fraction, job.text, job.detail) == (0.5, "half way", {"examples": 10})
    assert job.finished >= job.started and job.elapsed == job.finished - job.started
    assert mgr.get(job.id) is job and job in mgr.all() and mgr.last_end("eval") == job.finished


@pytest.mark.parametrize("error, status, message", [
    (RamStudioError("the folder is gone.", "Choose another."), "failed", ("the folder is gone.", "Choose another.")),
    (ValueError("bad shape\nsecond line"), "failed", ("unexpected ValueError: bad shape", "Look at the folder.")),
    (Cancelled("stopped on request."), "cancelled", ("stopped on request.", "")),
])
def test_how_a_job_ended_is_recorded_readably(error, status, message):
    def work(job):
        raise error

    job = finish(JobManager().submit("sweep", "me", "a sweep", work, hint="Look at the folder."))
    assert (job.status, job.error, job.result) == (status, message, None)


def test_one_merge_at_a_time_and_one_job_of_a_kind():
    mgr, gate = JobManager(), threading.Event()
    merge = mgr.submit("merge", "a", "a merge into out", held(gate), merges=True, out=Path("/tmp/ram-out"))
    try:
        with pytest.raises(Busy, match="a merge into out is already running in another session"):
            mgr.submit("fig3", "b", "the Fig. 3 experiment", held(gate), merges=True)  # it merges too
        with pytest.raises(Busy, match="already running in this session") as mine:
            mgr.submit("merge", "a", "a merge into other", held(gate), merges=True)
        assert "cancel it" in mine.value.hint
        sweep = mgr.submit("sweep", "b", "a sweep of 5 candidates", held(gate))  # no merge slot needed
        with pytest.raises(Busy, match="a sweep of 5 candidates is already running"):
            mgr.submit("sweep", "a", "a sweep of 2 candidates", held(gate))
        first = mgr.submit("eval", "a", "evaluating x", held(gate), exclusive=False, key="/x")
        assert mgr.submit("eval", "b", "evaluating x again", held(gate), exclusive=False, key="/x") is first
        other = mgr.submit("eval", "b", "evaluating y", held(gate), exclusive=False, key="/y")
        assert other is not first and mgr.running() is merge
    finally:
        gate.set()
    for job in (merge, sweep, first, other):
        assert finish(job).status == "done"
    assert mgr.running() is None


class SlowToMeasure:
    """A result whose size measurement waits for `gate`: holds a job in the moment between its work ending and its
    record being filed."""

    def __init__(self, gate: threading.Event, measuring: threading.Event) -> None:
        self.gate, self.measuring = gate, measuring

    def __sizeof__(self) -> int:
        self.measuring.set()
        self.gate.wait(20)
        return 64


def test_a_job_whose_work_has_ended_no_longer_holds_its_slot():
    mgr, gate, measuring = JobManager(), threading.Event(), threading.Event()
    first = mgr.submit("sweep", "me", "a sweep", lambda job: SlowToMeasure(gate, measuring), merges=True)
    try:
        assert measuring.wait(20) and first.status == "done"  # ended, its record not yet filed
        again = mgr.submit("sweep", "me", "the sweep again", held(gate), merges=True)  # a restart is not "busy"
        assert mgr.running() is again and mgr.orphan("sweep", lambda who: False) is again
        assert [j.id for j in mgr.all()].count(first.id) == 1
    finally:
        gate.set()
    assert finish(first).status == "done" and finish(again).status == "done"
    assert mgr.get(first.id) is first and mgr.running() is None


def test_only_the_owner_session_cancels_a_job():
    mgr, gate = JobManager(), threading.Event()
    job = mgr.submit("sweep", "owner", "a sweep", held(gate))
    try:
        assert not mgr.cancel(job.id, "someone-with-the-link") and not job.cancel.is_set()
        assert mgr.cancel(job.id, "owner")
        assert finish(job).status == "cancelled"
        assert not mgr.cancel(job.id, "owner")  # finished: nothing to cancel
    finally:
        gate.set()


def test_a_merge_folder_belongs_to_the_session_that_wrote_it():
    mgr, out, alive = JobManager(), Path("/tmp/ram-claimed"), {"a", "b"}
    done = finish(mgr.submit("merge", "a", "a merge", lambda job: "written", merges=True, out=out))
    with pytest.raises(RamStudioError, match="written by another session"):
        mgr.submit("merge", "b", "a merge", lambda job: "written", merges=True, out=out)
    assert not mgr.adopt(done.id, "b", alive.__contains__)  # "a" is still open: it keeps its folder
    with pytest.raises(RamStudioError, match="written by another session"):
        mgr.submit("merge", "b", "a merge", lambda job: "written", merges=True, out=out)
    alive.discard("a")
    assert mgr.adopt(done.id, "b", alive.__contains__) and done.owner == "b"
    again = finish(mgr.submit("merge", "b", "a merge again", lambda job: "again", merges=True, out=out))
    assert again.result == "again"

    def fails(job):
        raise RamStudioError("disk full.", "")

    failed = finish(mgr.submit("merge", "c", "a failing merge", fails, merges=True, out=Path("/tmp/ram-free")))
    assert failed.status == "failed"  # nothing written: the folder is nobody's
    assert finish(mgr.submit("merge", "d", "a merge", lambda job: "ok", merges=True, out=Path("/tmp/ram-free"))).result


# ---------------------------------------------------------------- memory

def rss() -> int:
    """This process's resident memory now (bytes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_finished_records_are_kept_within_their_memory_limit():
    """200 jobs each returning 4 MB: the records kept stay within the 40 MB limit (the newest ones, and the one
    shown recently), the process's resident memory grows by about the limit, not 800 MB; a running job is never
    dropped however old."""
    mgr, gate, limit = JobManager(limit=40 * MB), threading.Event(), 40 * MB
    running = mgr.submit("sweep", "me", "a long sweep", held(gate))
    ids, start = [], rss()
    try:
        for i in range(200):
            ids.append(finish(mgr.submit("fig3", "me", f"experiment {i}", lambda job: np.ones(MB // 2))).id)  # 4 MB
            assert mgr.get(ids[0]) is not None  # looked at after every job: the most recently shown stays
        kept = [j for j in mgr.all() if not j.running]
        assert sum(j.result.nbytes for j in kept) <= limit and 8 <= len(kept) <= 10
        assert ids[0] in {j.id for j in kept} and ids[-1] in {j.id for j in kept}
        assert mgr.get(running.id) is running and running.running
        assert mgr.get(ids[1]) is None and mgr.dropped(ids[1]) == ("fig3", "experiment 1")
        assert mgr.dropped(ids[-1]) is None
        growth = rss() - start
        print(f"resident memory grew {growth / MB:.0f} MB over 200 jobs of 4 MB (limit {limit / MB:.0f} MB)")
        assert growth < limit + 60 * MB, f"resident memory grew {growth / MB:.0f} MB for a {limit / MB:.0f} MB limit"
    finally:
        gate.set()
    finish(running)


def test_a_dropped_record_says_what_it_was_and_frees_a_gone_sessions_folder():
    alive = {"a"}
    mgr = JobManager(limit=1000)
    with mock.patch("app.jobs.session_alive", alive.__contains__):
        merge = finish(mgr.submit("merge", "a", "a merge into kept", lambda job: np.ones(1000), merges=True,
                                  out=Path("/tmp/ram-kept")))
        gone = finish(mgr.submit("merge", "b", "a merge into freed", lambda job: np.ones(1000), merges=True,
                                 out=Path("/tmp/ram-freed")))
        finish(mgr.submit("sweep", "c", "a sweep", lambda job: np.ones(1000)))  # drops both merges
        assert mgr.get(merge.id) is None and mgr.get(gone.id) is None
        assert mgr.dropped(merge.id) == ("merge", "a merge into kept")
        with pytest.raises(RamStudioError, match="written by another session"):  # "a" is open: still its folder
            mgr.submit("merge", "c", "a merge", lambda job: 1, merges=True, out=Path("/tmp/ram-kept"))
        finish(mgr.submit("merge", "c", "a merge", lambda job: 1, merges=True, out=Path("/tmp/ram-freed")))


# ------------------------------------------------------------- pages: a job's link, read-only while its owner is open

@pytest.fixture
def sessions(monkeypatch):
    """AppTest gives every app one session id: name them, and say which are connected, as a server would."""
    from app import jobs

    who = {"id": "first", "gone": set()}
    monkeypatch.setattr(jobs, "session_id", lambda: who["id"])
    monkeypatch.setattr(jobs, "session_alive", lambda sid: sid not in who["gone"])
    return who


def gated(stop: threading.Event, started: threading.Event):
    """Stands in for a page's long work (any signature): runs until cancelled, then stops like the real one."""
    def run(*args, cancel=None, **kwargs):
        started.set()
        while not cancel.wait(0.05):
            if stop.is_set():
                raise RamStudioError("stopped by the test.", "")
        raise Cancelled("stopped on request.")
    return run


# page, what its job runs (patched to run until cancelled), how it starts, its Cancel key, its job key
PAGES = {
    "merge": ("views/merge.py", "merging.merge.merge_to_folder", ["start_merge"], "cancel_merge", "merge_job"),
    "sweep": ("views/sweep.py", "evaluation.executors.run_local", ["sweep_preset_table2", "sweep_start"],
              "sweep_cancel", "sweep_job"),
    "fig3": ("views/dilution.py", "demo.fig3.run_experiment", ["fig3_run"], "fig3_cancel", "fig3_task"),
}


@contextlib.contextmanager
def started_job(kind: str, tmp_path: Path):
    """The first session starts the page's job (kept running until cancelled); yields (that session, the job)."""
    from app import jobs

    page, target, clicks, _, key = PAGES[kind]
    stop, started = threading.Event(), threading.Event()
    first = new_app()
    first.switch_page(page).run()
    if kind == "merge":
        first.text_input(key="merge_out").set_value(str(tmp_path / "out")).run()
    with mock.patch(target, gated(stop, started)):
        for k in clicks:
            first.button(key=k).click().run()
        assert started.wait(20), [plain(e.value) for e in first.error]
    job = jobs.manager().get(first.session_state[key])
    try:
        yield first, job
    finally:
        stop.set()
        job.thread.join(20)


def cancel_button(at, key: str):
    return next((b for b in at.button if b.key == key), None)


@pytest.mark.parametrize("kind", list(PAGES))
def test_a_link_to_a_live_sessions_job_follows_it_read_only(env, tmp_path, sessions, kind):
    """A second tab or person opening the first session's URL (`?job=`) sees the job running, read-only: no
    Cancel, the owner unchanged (a merge's folder too), the first session's Cancel still works. Once the first
    session has gone, the follower adopts the job and may cancel it."""
    page, _, _, cancel_key, job_key = PAGES[kind]
    with started_job(kind, tmp_path) as (first, job):
        assert first.query_params.get("job") in (job.id, [job.id])
        sessions["id"] = "second"
        second = new_app()
        second.query_params.update(first.query_params)
        second.switch_page(page).run()
        assert not second.exception and second.session_state[job_key] == job.id  # it follows the job…
        assert cancel_button(second, cancel_key).disabled and job.owner == "first"  # …read-only
        assert any(READ_ONLY in plain(c.value) for c in second.caption)
        if kind == "merge":
            assert any("Busy" in plain(w.value) for w in second.warning)
            assert not second.button(key="start_merge").disabled  # its form is its own: the Busy rule refuses
            second.text_input(key="merge_out").set_value(str(tmp_path / "out")).run()
            second.checkbox(key="merge_overwrite").check().run()
            second.button(key="start_merge").click().run()
            assert any("already running in another session" in plain(e.value) for e in second.error)
        second.run()  # a poll later: still the first session's job
        assert job.owner == "first" and cancel_button(second, cancel_key).disabled

        sessions["id"] = "first"
        first.run()
        assert not cancel_button(first, cancel_key).disabled  # the first tab kept its Cancel

        sessions["gone"].add("first")  # the first tab is closed: the follower adopts the job
        sessions["id"] = "second"
        second.run()
        assert job.owner == "second" and not cancel_button(second, cancel_key).disabled
        cancel_button(second, cancel_key).click().run()
        assert job.cancel.is_set()
    assert job.status == "cancelled"


def test_a_link_to_a_finished_merge_shows_it_but_the_folder_stays_its_sessions(env, tmp_path, sessions):
    """A finished merge opened through its link by another session while the first is open: the results are shown,
    the folder stays the first session's (not overwritten from the link), and the first may still overwrite it."""
    out = tmp_path / "merged"
    first = new_app()
    first.switch_page("views/merge.py").run()
    first.text_input(key="merge_out").set_value(str(out)).run()
    first.button(key="start_merge").click().run()
    wait_merge(first)
    no_problems(first)
    recipe = (out / "ram_recipe.json").read_bytes()

    sessions["id"] = "second"
    second = new_app()
    second.query_params.update(first.query_params)
    second.switch_page("views/merge.py").run()
    no_problems(second)
    assert any("Merged into" in plain(s.value) for s in second.success)  # the link shows the results
    second.text_input(key="merge_out").set_value(str(out)).run()
    second.checkbox(key="merge_overwrite").check().run()
    second.button(key="start_merge").click().run()
    assert any("written by another session" in plain(e.value) for e in second.error)
    assert (out / "ram_recipe.json").read_bytes() == recipe

    sessions["id"] = "first"
    first.checkbox(key="merge_overwrite").check().run()
    first.button(key="start_merge").click().run()
    wait_merge(first)
    no_problems(first)


def test_a_followed_job_dropped_from_memory_is_said_once(env, tmp_path, sessions, monkeypatch):
    """A page that followed a finished job whose record left memory says so once, then shows the page without it."""
    import streamlit as st

    from app import jobs
    from app.memory import JOB_ENV

    monkeypatch.setenv(JOB_ENV, "1KB")
    st.cache_resource.clear()  # a new server: the manager reads its limit when it is created
    try:
        at = new_app()
        at.switch_page("views/merge.py").run()
        at.text_input(key="merge_out").set_value(str(tmp_path / "m")).run()
        at.button(key="start_merge").click().run()
        wait_merge(at)
        label = jobs.manager().get(at.session_state["merge_job"]).label
        finish(jobs.manager().submit("sweep", "someone", "a sweep", lambda job: np.ones(1000)))  # drops the merge
        at.run()
        notes = [plain(i.value) for i in at.info if "dropped from this server's memory" in plain(i.value)]
        assert len(notes) == 1 and label in notes[0], [plain(i.value) for i in at.info]
        assert "merge_job" not in at.session_state and not any("Merged into" in plain(s.value) for s in at.success)
        at.run()
        assert not any("dropped from this server's memory" in plain(i.value) for i in at.info)
        assert "job" not in at.query_params
    finally:
        monkeypatch.delenv(JOB_ENV)
        st.cache_resource.clear()

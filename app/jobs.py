"""Background merge jobs: one worker thread at a time per server, owned by a process-wide job manager.

A job survives widget clicks, page changes and reruns because it lives in `st.cache_resource`, not in
the session; pages only read its progress. The worker never calls Streamlit.
"""
from __future__ import annotations

import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from merging.passes import Progress
from merging.common.errors import Cancelled, RamStudioError
from merging.recipe import MergeSpec
from merging.common.units import format_seconds


class Busy(RamStudioError):
    """Another merge is running in this server."""


@dataclass
class _Timed:
    """Status and timing shared by merge and evaluation jobs."""

    status: str = "running"
    error: tuple[str, str] | None = None  # (message, hint)
    started: float = field(default_factory=time.time)
    finished: float | None = None

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def elapsed(self) -> float:
        return (self.finished or time.time()) - self.started


@dataclass
class Job(_Timed):
    """One merge: its spec, owner session, live progress and outcome (status: running | done | failed |
    cancelled)."""

    id: str = ""
    spec: MergeSpec | None = None
    owner: str = ""
    out: Path = Path()
    cancel: threading.Event = field(default_factory=threading.Event)
    phase: str = "starting"
    progress: Progress | None = None
    result: object | None = None  # merging.merge.MergeResult
    thread: threading.Thread | None = field(default=None, repr=False)


@dataclass
class EvalJob(_Timed):
    """Evaluation of one merged folder on the demo tasks, in a worker thread (running | done | failed)."""

    id: str = ""
    folder: Path = Path()
    label: str = ""
    row: dict | None = None  # accuracy (%) per task, as in the demo's Table 1
    done: int = 0  # examples scored so far (counted per finished task)
    total: int = 0
    text: str = ""


@dataclass
class Task(_Timed):
    """Any other long job (a Hub download, the Fig. 3 experiment): the worker function reports a fraction
    and a line of text, and stops when `cancel` is set (status: running | done | failed | cancelled)."""

    id: str = ""
    kind: str = ""
    owner: str = ""
    label: str = ""
    cancel: threading.Event = field(default_factory=threading.Event)
    fraction: float = 0.0
    text: str = ""
    detail: object | None = None  # the worker's latest structured progress (e.g. per-file download state)
    result: object | None = None
    merges: bool = False  # holds the server's one merge slot while it runs


def record_outcome(record: _Timed, fn, hint: str):
    """Run a worker's body and record how it ended on `record` (done | cancelled | failed, with a readable
    error, never a traceback); returns its result, or None."""
    try:
        result = fn()
        record.status = "done"
        return result
    except Cancelled as exc:
        record.status, record.error = "cancelled", (exc.message, exc.hint)
    except RamStudioError as exc:
        record.status, record.error = "failed", (exc.message, exc.hint)
    except Exception as exc:  # noqa: BLE001 — shown to the user as one readable line
        text = str(exc).splitlines()[0] if str(exc) else ""
        record.status, record.error = "failed", (f"unexpected {type(exc).__name__}: {text}", hint)
    finally:
        record.finished = time.time()
    return None


class JobManager:
    """Process-wide registry; `submit` refuses a second merge while one is running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.jobs: dict[str, Job] = {}
        self.written_by: dict[Path, str] = {}  # output folder -> owner session
        self.evals: dict[str, EvalJob] = {}
        self.tasks: dict[str, Task] = {}
        self.last_download_end = 0.0  # when a download task last ended (download plans are cached until then)

    def running(self) -> Job | Task | None:
        """The merge (or merging task) running in this server, if any."""
        with self._lock:
            return self._busy()

    def _busy(self) -> Job | Task | None:
        return next((j for j in [*self.jobs.values(), *(t for t in self.tasks.values() if t.merges)] if j.running),
                    None)

    def get(self, job_id: str | None) -> Job | None:
        return self.jobs.get(job_id) if job_id else None

    def submit(self, spec: MergeSpec, owner: str, *, overwrite: bool = False, counts: dict | None = None,
               overlap: dict | None = None, provenance: dict | None = None, runner=None) -> Job:
        """Start `spec` in a worker thread; raises Busy (or a folder conflict) as a readable error."""
        out = Path(spec.out).expanduser().absolute()
        with self._lock:
            self._refuse_if_busy(owner)
            other = self.written_by.get(out)
            if other is not None and other != owner:
                raise RamStudioError(f"output folder {out} was written by another session.",
                                     "Choose a different output folder.")
            job = Job(id=uuid.uuid4().hex[:10], spec=spec, owner=owner, out=out)
            self.jobs[job.id] = job
            self.written_by[out] = owner
        job.thread = threading.Thread(target=self._work, args=(job, overwrite, counts, overlap, provenance, runner),
                                      daemon=True,
                                      name=f"ram-merge-{job.id}")
        job.thread.start()
        return job

    def _refuse_if_busy(self, owner: str) -> None:
        busy = self._busy()
        if busy is None:
            return
        mine = busy.owner == owner
        what = f"into {busy.out.name}" if isinstance(busy, Job) else busy.label
        raise Busy("a merge is already running " + ("in this session" if mine else "in another session")
                   + f" ({what}, {format_seconds(busy.elapsed)} so far).",
                   "One merge runs at a time per server: wait for it to finish"
                   + (" or cancel it." if mine else ", then start yours."))

    def _work(self, job: Job, overwrite: bool, counts: dict | None, overlap: dict | None, provenance: dict | None,
              runner) -> None:
        from merging.merge import merge_to_folder

        def on_merge(p: Progress) -> None:
            job.phase, job.progress = "merge", p

        def on_count(p: Progress) -> None:
            job.phase, job.progress = "count", p

        run = runner or merge_to_folder
        job.result = record_outcome(job, lambda: run(job.spec, overwrite=overwrite, counts=counts, overlap=overlap,
                                                     provenance=provenance, progress=on_merge, cancel=job.cancel,
                                                     count_progress=on_count),
                                    "Check the output folder and the inputs, then try again.")
        with self._lock:
            if job.status != "done":
                self.written_by.pop(job.out, None)

    def submit_eval(self, folder: Path, label: str, runner) -> EvalJob:
        """Evaluate `folder` with `runner(folder, ev) -> row` in a thread (one per folder at a time); the
        runner counts its progress in `ev.done` / `ev.total` (examples) and `ev.text`."""
        with self._lock:
            for ev in self.evals.values():
                if ev.running and ev.folder == folder:
                    return ev
            ev = EvalJob(id=uuid.uuid4().hex[:10], folder=folder, label=label)
            self.evals[ev.id] = ev

        def work() -> None:
            ev.row = record_outcome(ev, lambda: runner(folder, ev),
                                    "Is this a model built from the demo base? Only those can be scored on the demo "
                                    "tasks.")

        threading.Thread(target=work, daemon=True, name=f"ram-eval-{ev.id}").start()
        return ev

    def submit_task(self, kind: str, owner: str, label: str, fn, *, merges: bool = False) -> Task:
        """Run `fn(task) -> result` in a thread. One task of a kind runs at a time per server (a second
        submit of a running kind returns Busy); `merges` tasks also take the one merge slot."""
        with self._lock:
            if merges:
                self._refuse_if_busy(owner)
            other = next((t for t in self.tasks.values() if t.kind == kind and t.running), None)
            if other is not None:
                raise Busy(f"{other.label} is already running ({format_seconds(other.elapsed)} so far).",
                           "Wait for it to finish" + (" or cancel it." if other.owner == owner else "."))
            task = Task(id=uuid.uuid4().hex[:10], kind=kind, owner=owner, label=label, merges=merges)
            self.tasks[task.id] = task

        def work() -> None:
            task.result = record_outcome(task, lambda: fn(task), "Check the inputs, then try again.")
            if kind == "download":
                self.last_download_end = task.finished

        threading.Thread(target=work, daemon=True, name=f"ram-{kind}-{task.id}").start()
        return task

    def task(self, task_id: str | None) -> Task | None:
        return self.tasks.get(task_id) if task_id else None

    def record(self, record_id: str) -> Job | Task | None:
        """A merge job or a task by id."""
        return self.jobs.get(record_id) or self.tasks.get(record_id)

    def adopt(self, record_id: str, owner: str) -> None:
        """Make `owner` (a new session: the page was reloaded or opened by its URL) the owner of a job: it may
        cancel it, and the folder a merge wrote is its own (a new merge may overwrite it)."""
        with self._lock:
            rec = self.record(record_id)
            if rec is None or rec.owner == owner:
                return
            if isinstance(rec, Job) and self.written_by.get(rec.out) == rec.owner:
                self.written_by[rec.out] = owner
            rec.owner = owner

    def orphan(self, kind: str, alive) -> Job | Task | None:
        """The newest running job of `kind` ("merge" or a task kind) whose session has gone (`alive(owner)` is
        False). A finished one is re-attached only through its URL (`?job=`): a stranger opening the app never
        inherits someone else's results."""
        with self._lock:
            pool = list(self.jobs.values()) if kind == "merge" else [t for t in self.tasks.values() if t.kind == kind]
        gone = [r for r in pool if r.running and not alive(r.owner)]
        return max(gone, key=lambda r: r.started, default=None)

    def cancel(self, job_id: str) -> None:
        job = self.jobs.get(job_id) or self.tasks.get(job_id)
        if job is not None and job.running:
            job.cancel.set()


@st.cache_resource(show_spinner=False)
def manager() -> JobManager:
    """The one job manager of this server process (shared by every session)."""
    return JobManager()


def session_id() -> str:
    """This browser session's id (the owner of the jobs it starts)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else "local"


# ---------------------------------------------------------------- which jobs a session follows

URL_JOB = "job"  # the URL's query parameter holding the ids of the jobs a session follows
FOLLOWED_KEY = "_followed_jobs"  # kind -> id of the job of that kind this session shows
_JOB_ID = re.compile(r"^[0-9a-f]{10}$")


def session_alive(session_id: str) -> bool:
    """True while a browser session is connected to this server (an AppTest run has no server: always True)."""
    from streamlit.runtime import Runtime

    return not Runtime.exists() or Runtime.instance().is_active_session(session_id)


def follow(state_key: str, kind: str) -> str | None:
    """The id of the job of `kind` ("merge", "fig3", "sweep", …) this session shows under `state_key`.

    A new session (a reload, a bookmark, the page opened by its URL) re-attaches to the job its URL names
    (`?job=ID`, kept there by `remember`), else to the newest running one whose session has gone; it then owns it:
    progress, cancel and results come back, and the folder a merge wrote is its own."""
    mgr, me = manager(), session_id()
    rid = st.session_state.get(state_key)
    if rid is not None and mgr.record(rid) is not None:
        return rid
    named = [r for r in st.query_params.get_all(URL_JOB) if _JOB_ID.match(r)]  # untrusted: ids only
    found = next((rec for rec in map(mgr.record, named) if rec is not None and kind_of(rec) == kind), None)
    if found is None:
        found = mgr.orphan(kind, session_alive)
    if found is None:
        return None
    mgr.adopt(found.id, me)
    remember(state_key, kind, found.id)
    return found.id


def remember(state_key: str, kind: str, record_id: str) -> None:
    """This session now shows job `record_id` under `state_key`; its id goes into the URL (`?job=`)."""
    st.session_state[state_key] = record_id
    st.session_state.setdefault(FOLLOWED_KEY, {})[kind] = record_id
    ids = list(st.session_state[FOLLOWED_KEY].values())
    if st.query_params.get_all(URL_JOB) != ids:
        st.query_params[URL_JOB] = ids


def followed() -> list[str]:
    """The ids of the jobs this session follows (for the URL)."""
    return list(st.session_state.get(FOLLOWED_KEY, {}).values())


def kind_of(rec: Job | Task) -> str:
    return "merge" if isinstance(rec, Job) else rec.kind


def cancel_row(record_id: str, owner: str, *, button: str, key: str, toast: str, caption: str) -> None:
    """Under a running job's progress bar: Cancel (for the session that started it) and what happens meanwhile."""
    c = st.columns([1, 4], vertical_alignment="center")
    if c[0].button(button, icon=":material/stop_circle:", key=key, disabled=owner != session_id()):
        manager().cancel(record_id)
        st.toast(toast)
    c[1].caption(caption)

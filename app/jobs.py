"""Background jobs: one record, one submit, one way for a page to follow a job.

Every long piece of work the app starts — a merge, an evaluation of a merged folder, a Hub download, the Fig. 3
experiment, a sweep, A/B scoring — is a `Job` run by the server-wide `JobManager` in a worker thread. The manager
lives in `st.cache_resource`, not in a session, so a job survives widget clicks, page changes and reloads; pages
only read its progress (`poll`). The worker never calls Streamlit.

The rules every page relies on:
- one job of a kind at a time per server (a second start is refused as `Busy`) unless submitted with
  `exclusive=False`; a `key` makes a second request for the same thing return the running job;
- one merge at a time per server: every job that writes or builds merged models (`merges=True`) takes one slot;
- a job belongs to the session that started it: only that session can cancel it, and the folder a merge wrote is
  its own. A session that is still open keeps its jobs: another tab that opens the job's link (`?job=ID`) follows
  it read-only. A session adopts a job only when its owner has gone (a reload, a closed tab);
- finished records are kept within `RAM_STUDIO_APP_JOB_MEMORY` bytes, least recently shown dropped first
  (app/memory.py); a page that followed a dropped job says so.
"""
from __future__ import annotations

import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import streamlit as st

from app.memory import DEFAULT_JOB_BYTES, FORGOTTEN, JOB_ENV, LRUStore, limit_from_env, measure_bytes
from merging.common.errors import Cancelled, RamStudioError
from merging.common.units import format_seconds

RETRY_HINT = "Check the inputs, then try again."


class Busy(RamStudioError):
    """A job that must run alone (one merge per server, one job of a kind) is already running."""


@dataclass
class Job:
    """One background job: what it is, who started it, its live progress, its cancel switch and its outcome.

    status: running | done | failed | cancelled. The worker reports through `fraction` (0–1), `text` (one line)
    and `detail` (its latest structured progress: a merge's Progress, a download's per-file state, a sweep's
    scores so far); `result` is what it returned, `error` a readable (message, hint) when it did not finish."""

    id: str
    kind: str  # merge | eval | download | fig3 | sweep | measure | …
    owner: str  # the session that may cancel it (and whose folder a merge wrote)
    label: str  # what it is, in words: "a merge into demo-ram-1a2b", "the Fig. 3 experiment"
    merges: bool = False  # holds the server's one merge slot while it runs
    key: str | None = None  # what it works on (a folder): a second request for the same key joins it
    out: Path | None = None  # the folder a merge writes (claimed for its owner while the record exists)
    request: Any = None  # what it was started with (a merge's MergeSpec), for its results
    status: str = "running"
    error: tuple[str, str] | None = None
    started: float = field(default_factory=time.time)
    finished: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    fraction: float = 0.0
    text: str = ""
    detail: Any = None
    result: Any = None
    thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def elapsed(self) -> float:
        return (self.finished or time.time()) - self.started

    def report(self, fraction: float | None = None, text: str | None = None, detail: Any = None) -> None:
        """The worker's progress: any of the fraction done, a line of text, a structured detail."""
        if fraction is not None:
            self.fraction = fraction
        if text is not None:
            self.text = text
        if detail is not None:
            self.detail = detail


def run_recorded(job: Job, work: Callable[[Job], Any], hint: str) -> None:
    """Run `work(job)` and record how it ended on `job` (done with its result, cancelled, or failed with a
    readable error, never a traceback)."""
    try:
        job.result = work(job)
        job.status = "done"
    except Cancelled as exc:
        job.status, job.error = "cancelled", (exc.message, exc.hint)
    except RamStudioError as exc:
        job.status, job.error = "failed", (exc.message, exc.hint)
    except Exception as exc:  # noqa: BLE001 — shown to the user as one readable line
        text = str(exc).splitlines()[0] if str(exc) else ""
        job.status, job.error = "failed", (f"unexpected {type(exc).__name__}: {text}", hint)
    finally:
        job.finished = time.time()


class JobManager:
    """The server's jobs: running ones, and finished ones within a memory limit (`limit` bytes, else
    $RAM_STUDIO_APP_JOB_MEMORY, else 256 MB)."""

    def __init__(self, limit: int | None = None) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, Job] = {}
        self._finished = LRUStore(limit or limit_from_env(JOB_ENV, DEFAULT_JOB_BYTES), "job record",
                                  on_drop=self._dropped)
        self._gone: OrderedDict[str, tuple[str, str]] = OrderedDict()  # dropped id -> (kind, label)
        self._claims: dict[Path, tuple[str, str]] = {}  # a merge's output folder -> (job id, owner session)
        self._last_end: dict[str, float] = {}  # kind -> when its last job ended

    # ------------------------------------------------------------ starting

    def submit(self, kind: str, owner: str, label: str, work: Callable[[Job], Any], *, merges: bool = False,
               exclusive: bool = True, key: str | None = None, out: Path | None = None, request: Any = None,
               hint: str = RETRY_HINT) -> Job:
        """Run `work(job) -> result` in a worker thread, as a job of `kind` started by session `owner`. Refuses
        (Busy, or a folder another session wrote) before anything starts; `hint` goes with an unexpected error."""
        out = Path(out).expanduser().absolute() if out is not None else None
        with self._lock:
            joined = next((j for j in self._live() if key is not None and j.kind == kind and j.key == key), None)
            if joined is not None:
                return joined
            self._refuse_if_busy(kind, owner, merges, exclusive)
            claim = self._claims.get(out) if out is not None else None
            if claim is not None and claim[1] != owner:
                raise RamStudioError(f"output folder {out} was written by another session.",
                                     "Choose a different output folder.")
            job = Job(id=uuid.uuid4().hex[:10], kind=kind, owner=owner, label=label, merges=merges, key=key, out=out,
                      request=request)
            self._running[job.id] = job
            if out is not None:
                self._claims[out] = (job.id, owner)
        job.thread = threading.Thread(target=self._work, args=(job, work, hint), daemon=True,
                                      name=f"ram-{kind}-{job.id}")
        job.thread.start()
        return job

    def _refuse_if_busy(self, kind: str, owner: str, merges: bool, exclusive: bool) -> None:
        slot = next((j for j in self._live() if j.merges), None) if merges else None
        if slot is not None:
            mine = slot.owner == owner
            raise Busy(f"{slot.label} is already running " + ("in this session" if mine else "in another session")
                       + f" ({format_seconds(slot.elapsed)} so far).",
                       "One merge runs at a time per server: wait for it to finish"
                       + (" or cancel it." if mine else ", then start yours."))
        same = next((j for j in self._live() if j.kind == kind), None) if exclusive else None
        if same is not None:
            raise Busy(f"{same.label} is already running ({format_seconds(same.elapsed)} so far).",
                       "Wait for it to finish" + (" or cancel it." if same.owner == owner else "."))

    def _live(self) -> list[Job]:
        """The jobs still working (lock held): one whose work has ended, while its record is filed, holds no slot."""
        return [j for j in self._running.values() if j.running]

    def _work(self, job: Job, work: Callable[[Job], Any], hint: str) -> None:
        run_recorded(job, work, hint)
        size = measure_bytes(job)
        with self._lock:
            if job.out is not None and job.status != "done" and self._claims.get(job.out, ("",))[0] == job.id:
                del self._claims[job.out]  # nothing was written: the folder is nobody's
            self._last_end[job.kind] = job.finished or time.time()
        self._finished.put(job.id, job, size)  # kept before it leaves the running set: never missing
        with self._lock:
            self._running.pop(job.id, None)

    def _dropped(self, job_id: str, job: Job, _size: int) -> None:
        """A finished record left memory: remember what it was; its folder claim goes once its owner has gone."""
        with self._lock:
            self._gone[job_id] = (job.kind, job.label)
            while len(self._gone) > FORGOTTEN:
                self._gone.popitem(last=False)
            stale = [out for out, (jid, who) in self._claims.items()
                     if jid not in self._running and jid not in self._finished and not session_alive(who)]
            for out in stale:
                del self._claims[out]

    # ------------------------------------------------------------ looking

    def get(self, job_id: str | None) -> Job | None:
        """A job by id (a finished one now counts as recently shown), or None."""
        if not job_id:
            return None
        with self._lock:
            return self._running.get(job_id) or self._finished.get(job_id)

    def running(self) -> Job | None:
        """The job holding this server's merge slot, if any."""
        with self._lock:
            return next((j for j in self._live() if j.merges), None)

    def all(self) -> list[Job]:
        """Every job the server holds (running, then finished least recently shown first)."""
        with self._lock:
            return [*self._running.values(), *(j for j in self._finished.values() if j.id not in self._running)]

    def dropped(self, job_id: str) -> tuple[str, str] | None:
        """(kind, label) of a finished job whose record was dropped to stay within the memory limit."""
        with self._lock:
            return self._gone.get(job_id) if job_id not in self._running else None

    def last_end(self, kind: str) -> float:
        """When the last job of `kind` ended (0 if none has): e.g. cached download plans are stale after it."""
        return self._last_end.get(kind, 0.0)

    # ------------------------------------------------------------ owners

    def orphan(self, kind: str, alive: Callable[[str], bool]) -> Job | None:
        """The newest running job of `kind` whose session has gone (`alive(owner)` is False). A finished one is
        re-attached only through its link (`?job=`): a stranger opening the app never inherits someone's results."""
        with self._lock:
            gone = [j for j in self._live() if j.kind == kind and not alive(j.owner)]
        return max(gone, key=lambda j: j.started, default=None)

    def adopt(self, job_id: str, owner: str, alive: Callable[[str], bool]) -> bool:
        """Make `owner` (a new session: a reload, the job's link) the owner of a job whose session has gone: it
        may cancel it, and the folder a merge wrote is its own. A session that is still open keeps its job."""
        with self._lock:
            job = self._running.get(job_id) or self._finished.get(job_id)
            if job is None or job.owner == owner:
                return job is not None
            if alive(job.owner):
                return False
            if job.out is not None and self._claims.get(job.out, ("",))[0] == job.id:
                self._claims[job.out] = (job.id, owner)
            job.owner = owner
            return True

    def cancel(self, job_id: str, by: str) -> bool:
        """Ask a running job to stop; only its owner session may. True when the request was passed on."""
        job = self.get(job_id)
        if job is None or not job.running or job.owner != by:
            return False
        job.cancel.set()
        return True


@st.cache_resource(show_spinner=False)
def manager() -> JobManager:
    """The one job manager of this server process (shared by every session)."""
    return JobManager()


def session_id() -> str:
    """This browser session's id (the owner of the jobs it starts)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else "local"


def session_alive(sid: str) -> bool:
    """True while a browser session is connected to this server (an AppTest run has no server: always True)."""
    from streamlit.runtime import Runtime

    return not Runtime.exists() or Runtime.instance().is_active_session(sid)


# ---------------------------------------------------------------- which jobs a session follows

URL_JOB = "job"  # the URL's query parameter holding the ids of the jobs a session follows
FOLLOWED_KEY = "_followed_jobs"  # kind -> id of the job of that kind this session shows
NOTED_KEY = "_dropped_jobs_noted"  # ids whose "dropped from memory" note this session has shown
JOB_ID = re.compile(r"^[0-9a-f]{10}$")


def follow(state_key: str, kind: str) -> Job | None:
    """The job of `kind` ("merge", "sweep", …) this session shows under `state_key`.

    A new session (a reload, a bookmark, a shared link) re-attaches to the job its URL names (`?job=ID`, kept
    there by `remember`), else to the newest running one whose session has gone. It owns the job only when the
    session that started it has gone; while that session is open, this one follows it read-only."""
    mgr = manager()
    job = _known(state_key, kind, mgr)
    if job is None:
        named = [r for r in st.query_params.get_all(URL_JOB) if JOB_ID.match(r)]  # untrusted: ids only
        job = next((j for j in map(mgr.get, named) if j is not None and j.kind == kind), None)
        if job is None:
            _note_dropped([r for r in named if r not in st.session_state.get(NOTED_KEY, ())], kind, mgr)
            job = mgr.orphan(kind, session_alive)
        if job is None:
            return None
        remember(state_key, kind, job.id)
    claim(job)
    return job


def _known(state_key: str, kind: str, mgr: JobManager) -> Job | None:
    """The job this session already follows under `state_key`; None (with a note if it was dropped) if none."""
    rid = st.session_state.get(state_key)
    job = mgr.get(rid)
    if rid is not None and job is None:
        forget(state_key, kind)
        _note_dropped([rid], kind, mgr)
    return job


def _note_dropped(ids: list[str], kind: str, mgr: JobManager) -> None:
    for rid in ids:
        gone = mgr.dropped(rid)
        if gone is not None and gone[0] == kind:
            st.session_state.setdefault(NOTED_KEY, set()).add(rid)
            st.info(f"The record of {gone[1]} has been dropped from this server's memory (it keeps the most recently "
                    "shown finished jobs, within its limit), so its results are no longer shown here. Anything it "
                    "wrote to disk is unaffected.", icon=":material/history_toggle_off:")


def claim(job: Job) -> bool:
    """Adopt `job` for this session when its owner session has gone; True when this session owns it."""
    me = session_id()
    return job.owner == me or manager().adopt(job.id, me, session_alive)


def remember(state_key: str, kind: str, job_id: str) -> None:
    """This session now shows job `job_id` under `state_key`; its id goes into the URL (`?job=`)."""
    st.session_state[state_key] = job_id
    st.session_state.setdefault(FOLLOWED_KEY, {})[kind] = job_id
    _sync_url()


def forget(state_key: str, kind: str) -> None:
    """This session no longer shows a job under `state_key`."""
    st.session_state.pop(state_key, None)
    st.session_state.get(FOLLOWED_KEY, {}).pop(kind, None)
    _sync_url()


def _sync_url() -> None:
    ids = followed()
    if st.query_params.get_all(URL_JOB) != ids:
        if ids:
            st.query_params[URL_JOB] = ids
        else:
            st.query_params.pop(URL_JOB, None)


def followed() -> list[str]:
    """The ids of the jobs this session follows (for the URL)."""
    return list(st.session_state.get(FOLLOWED_KEY, {}).values())


# ---------------------------------------------------------------- following a job on a page

@dataclass(frozen=True)
class CancelButton:
    """The Cancel row under a running job's progress: its label, widget key, toast, and what to say meanwhile
    (text, or a function of the job)."""

    label: str
    key: str
    toast: str = "Cancelling…"
    caption: str | Callable[[Job], str] = ""


READ_ONLY = ("Started in another session that is still open (another tab or person): you can follow it here; only "
             "that session can cancel it.")


def poll(job: Job, draw: Callable[[Job], None], *, every: float = 1.0, cancel: CancelButton | None = None) -> None:
    """Follow a running job on the page: `draw(job)` in a fragment redrawn every `every` seconds, then the Cancel
    row (enabled for the owner session only; another session reads that it follows the job read-only). Once the
    job is no longer running — even if it ended before the first draw — the whole page is redrawn, so a form
    disabled while it ran never stays disabled."""
    job_id = job.id

    def panel() -> None:
        current = manager().get(job_id)
        if current is None or not current.running:
            st.rerun(scope="app")
        draw(current)
        mine = claim(current)
        if cancel is not None:
            c = st.columns([1, 4], vertical_alignment="center")
            if c[0].button(cancel.label, icon=":material/stop_circle:", key=cancel.key, disabled=not mine):
                if manager().cancel(job_id, session_id()):
                    st.toast(cancel.toast)
            text = cancel.caption(current) if callable(cancel.caption) else cancel.caption
            c[1].caption(text if mine else READ_ONLY)
        elif not mine:
            st.caption(READ_ONLY)

    with st.container():
        st.fragment(run_every=every)(panel)()


def ending(job: Job, what: str, *, cancelled: str | None = None) -> bool:
    """Show how a finished job ended when it did not succeed (the cancel note, or its error as `what` failing);
    True when it is done with a result for the page to show."""
    from app.errors import show_error

    if job.status == "cancelled":
        st.info(cancelled or (job.error[0] if job.error else f"{what} was cancelled."), icon=":material/cancel:")
    elif job.status == "failed":
        show_error(RamStudioError(*(job.error or (f"{what} failed.", RETRY_HINT))), what)
    return job.status == "done"

"""The Hub download panel shared by Models, Heterogeneity, Tune and Merge: what downloading needs (bytes, where
the files go, free space) before it starts, then per-file and overall progress with cancel, in a background
task (merging/reading/hub.py and hub_download.py do the work; this is the view)."""
from __future__ import annotations

import streamlit as st

from app import jobs
from app.errors import show_error
from app.markup import md, md_code
from merging.common.errors import RamStudioError
from merging.common.units import format_bytes, format_seconds

TASK_KEY = "download_task"


def hub_refs(refs: list[str]) -> list[str]:
    from merging.reading.refs import parse_ref

    out = []
    for ref in refs:
        try:
            if parse_ref(ref).kind == "hub":
                out.append(ref)
        except RamStudioError:
            pass
    return out


@st.cache_data(ttl=30, show_spinner=False, max_entries=32)
def plan_for(refs_key: str, marker: float):
    """The download plan of these Hub refs ('|'-joined), cached briefly: it costs two Hub requests per repo.
    `marker` (when the last download ended) makes a finished or cancelled download refresh it."""
    from merging.reading.hub import plan_download
    from merging.reading.refs import hub_repos

    return plan_download(hub_repos(refs_key.split("|")))


def _work(plan, job: jobs.Job):
    from merging.reading.hub import download

    return download(plan, progress=lambda p: job.report(p.fraction, detail=p), cancel=job.cancel)


def progress_panel(task: jobs.Job) -> None:
    """Live progress of the running download (drawn by jobs.poll every 0.5 s)."""
    p = task.detail
    if p is None:
        st.progress(0.0, text="Starting the download…")
    else:
        eta = f" · about {format_seconds(p.eta)} left" if p.eta is not None else ""
        st.progress(min(1.0, p.fraction),
                    text=f"Overall: {format_bytes(p.done)} of {format_bytes(p.total)} · {format_bytes(p.rate)}/s"
                         f"{eta} · {p.files_done} of {p.files_total} files")
        st.progress(min(1.0, p.file_done / p.file_total) if p.file_total else 0.0,
                    text=f"{md(p.repo_id)} · {md(p.file)}: {format_bytes(p.file_done)} of {format_bytes(p.file_total)}")


CANCEL_DOWNLOAD = jobs.CancelButton(
    "Cancel download", "download_cancel", toast="Cancelling… the part already downloaded is kept.",
    caption=lambda task: (f"Running for {format_seconds(task.elapsed)}. You can switch pages; the download keeps "
                          "going, and an interrupted one resumes where it stopped."))


def panel(refs: list[str], *, what: str = "the analysis") -> bool:
    """Say what downloading the Hub models among `refs` needs, offer the download, follow it. True when every
    one of them is in the local cache (nothing left to download)."""
    hub = hub_refs(refs)
    if not hub:
        return True
    mgr = jobs.manager()
    task = mgr.get(st.session_state.get(TASK_KEY))
    if task is not None and task.running:
        jobs.poll(task, progress_panel, every=0.5, cancel=CANCEL_DOWNLOAD)
        return False
    if task is not None and task.status == "cancelled":
        st.info(task.error[0] if task.error else "Download cancelled.", icon=":material/pause_circle:")
    elif task is not None:
        jobs.ending(task, "The download")
    try:
        with st.spinner("Asking the Hub which files are needed…"):
            plan = plan_for("|".join(hub), mgr.last_end("download"))
    except RamStudioError as exc:
        show_error(exc, "Planning the download")
        return False
    if plan.remaining == 0:
        if task is not None and task.status == "done":
            st.success(f"Downloaded: {len(plan.repos)} Hub models are in the local cache ({md(plan.cache_dir)}).",
                       icon=":material/download_done:")
        return True
    free = plan.free()
    kept = plan.cached + plan.partial
    c = st.columns(3)
    c[0].metric("To download", format_bytes(plan.remaining),
                help=f"{len(plan.files)} files of {len(plan.repos)} repos (safetensors, configs, tokenizer)."
                     + (f" {format_bytes(kept)} are already in the cache; partial files resume." if kept else ""))
    c[1].metric("Free on that disk", format_bytes(free))
    c[2].metric("Files", f"{sum(1 for f in plan.files if not f.cached)} of {len(plan.files)} missing")
    st.caption(f"The files go into the Hugging Face cache, {md_code(plan.cache_dir)} (set HF_HUB_CACHE or HF_HOME to "
               f"move it), where other tools find them too. {what.capitalize()} reads them from there.")
    if free < plan.remaining:
        st.warning(f"Not enough free space: the download needs {format_bytes(plan.remaining)}, "
                   f"{format_bytes(free)} are free in {md_code(plan.cache_dir)}.", icon=":material/warning:")
    again = plan.partial > 0 or (task is not None and task.status in ("cancelled", "failed"))
    label = f"{'Continue' if again else 'Start'} the download ({format_bytes(plan.remaining)})"
    if st.button(label, type="primary", icon=":material/download:", key="download_start"):
        try:
            task = mgr.submit("download", jobs.session_id(), f"the download of {len(plan.repos)} Hub models",
                              lambda j, pl=plan: _work(pl, j))
        except RamStudioError as exc:
            show_error(exc, "Starting the download")
        else:
            st.session_state[TASK_KEY] = task.id
            st.rerun()
    return False

"""A Streamlit page that runs one of the app's long jobs exactly the way the app does, for app_vs_cli.py.

Run by `streamlit run` (a real server); every new browser session starts the job named by
$RAM_BENCH_JOB (JSON: kind = merge | analyze | evaluate | fig3, models, out, result) through the app's
own code — the process-wide `app.jobs` manager and its worker threads, the analysis in the script
thread through `app.state.run_analysis`, a fragment polling the job every 0.5 s as the Merge page's
progress panel does — and writes the job's timing to `result` + the session's run number.
The worker bodies of the evaluation and the Fig. 3 job live in page scripts (app/views/merge.py,
app/views/dilution.py); their functions are taken from the files without running the pages.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import streamlit as st

from app import jobs, state
from merging.recipe import MergeSpec
from tests.benchmarks import app_vs_cli

CFG = json.loads(os.environ["RAM_BENCH_JOB"])


page_functions = st.cache_resource(show_spinner=False)(app_vs_cli.page_functions)


@st.cache_resource(show_spinner=False)
def run_counter() -> list[int]:
    return [0]


def write(run: int, record: dict) -> None:
    path = Path(f"{CFG['result']}.{run}.json")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
    st.write("BENCH-DONE")


def poll(job_id: str, run: int, started: float) -> None:
    """The Merge page's progress panel, reduced: read the job's progress twice a second."""
    mgr = jobs.manager()
    job = mgr.get(job_id)
    if job.running:
        st.progress(min(1.0, job.fraction), text=f"{job.status} · {time.time() - started:.1f} s")
        return
    if Path(f"{CFG['result']}.{run}.json").exists():
        return  # reported already
    result = getattr(job, "result", None)
    write(run, {"kind": CFG["kind"], "status": job.status, "error": job.error, "job_s": job.elapsed,
                "engine_s": getattr(result, "seconds", None), "pid": os.getpid()})


def start_job(kind: str, run: int, mgr: jobs.JobManager):
    """Start the job as the app's page does; returns its record."""
    if kind == "merge":
        state.run_analysis(sel)  # the Models page's analysis (from the disk cache the CLI's `analyze` wrote)
        # Each session its own folder: the server refuses a folder another session wrote.
        spec = MergeSpec(sel.base, list(sel.agents), CFG["method"], {}, f"{CFG['result']}-out.{run}")
        counts, overlap = state.cached_statistics(sel, spec)
        st.session_state["bench_t0"] = time.time()
        fns = page_functions("app/views/merge.py")
        job = mgr.submit("merge", jobs.session_id(), "bench",
                         lambda j: fns["run_merge"](spec, j, overwrite=True, counts=counts, overlap=overlap,
                                                    provenance=None), merges=True, out=Path(spec.out), request=spec)
    elif kind == "evaluate":
        fns = page_functions("app/views/merge.py")
        folder = Path(CFG["folder"])
        job = mgr.submit("eval", jobs.session_id(), "bench", lambda j: fns["run_demo_eval"](folder, j),
                         exclusive=False)
    elif kind == "fig3":
        fns = page_functions("app/views/dilution.py")
        job = mgr.submit("fig3", jobs.session_id(), "the Fig. 3 experiment",
                         lambda j, s=sel: fns["run_fig3"](s, j), merges=True)
    else:
        raise ValueError(f"unknown job kind {kind!r}")
    return job


sel = state.Selection(CFG["base"], tuple(CFG["agents"]), "custom")
if "bench_run" not in st.session_state:
    counter = run_counter()
    counter[0] += 1
    run = st.session_state["bench_run"] = counter[0]
    t0 = time.time()
    st.session_state["bench_t0"] = t0
    mgr = jobs.manager()
    kind = CFG["kind"]
    if kind == "analyze":
        state.forget_analysis(sel)  # re-read the weights, as "Re-analyse" does
        res = state.run_analysis(sel)
        write(run, {"kind": kind, "status": "done" if res is not None else "failed", "job_s": time.time() - t0,
                    "pid": os.getpid()})
        st.stop()
    try:
        job = start_job(kind, run, mgr)
    except Exception as exc:  # noqa: BLE001 - reported to the benchmark instead of leaving it waiting
        write(run, {"kind": kind, "status": "failed", "error": f"{type(exc).__name__}: {exc}", "job_s": 0.0,
                    "pid": os.getpid()})
        st.stop()
    st.session_state["bench_job"] = job.id

if "bench_job" in st.session_state:
    st.fragment(run_every=0.5)(poll)(st.session_state["bench_job"], st.session_state["bench_run"],
                                     st.session_state["bench_t0"])

"""Merge & export: run a merge as a background job, follow it, then download / push / evaluate the result."""
from __future__ import annotations

import importlib.util
import io
import json
import os
import zipfile
from pathlib import Path

import pandas as pd
import streamlit as st

from app import jobs, state
from merging.compat import POLICIES, POLICY_HELP
from merging.errors import RamStudioError
from merging.methods import METHODS, get_method
from merging.recipe import MergeSpec
from merging.units import format_bytes, format_seconds

JOB_KEY = "merge_job"
START_ERROR_KEY = "merge_start_error"
EVAL_KEY = "eval_rows"
ZIP_LIMIT = 300e6  # offer a zip download only below this size
STEPS = {"eps": 1e-6, "r": 0.01, "alpha": 0.1, "lambda": 0.05, "density": 0.05, "drop_rate": 0.05}
SHARD_SIZES = ["100MB", "500MB", "1GB", "2GB", "5GB", "10GB"]
DTYPES = {"as base": None, "BF16": "BF16", "F16": "F16", "F32": "F32"}


def default_method(p: dict) -> str:
    return "ram_plus_soft" if p.get("rule") == "soft" else "ram_plus"


def default_out(sel: state.Selection, method: str) -> str:
    label = "demo" if sel.is_demo else (sel.base.replace("/", "_").split(":")[-1] or "model")
    return str(Path.cwd() / "merged" / f"{label}-{method}")


def param_widgets(method: str, tuned: dict, disabled: bool) -> dict:
    """One input per method parameter, built from its declaration and pre-filled from the Tune page."""
    m = get_method(method)
    values = {}
    cols = st.columns(max(1, min(4, len(m.params))))
    for i, p in enumerate(m.params):
        key = f"param_{method}_{p.name}"
        value = tuned.get(p.name, p.default)
        col = cols[i % len(cols)]
        if p.choices:
            values[p.name] = col.selectbox(p.name, list(p.choices), index=list(p.choices).index(value), help=p.help,
                                           key=key, disabled=disabled)
        elif p.kind is bool:
            values[p.name] = col.checkbox(p.name, bool(value), help=p.help, key=key, disabled=disabled)
        elif p.kind in (int, float):
            lo = None if p.low is None else p.kind(p.low)
            hi = None if p.high is None or p.high_open else p.kind(p.high)
            values[p.name] = col.number_input(
                p.name, min_value=lo, max_value=hi, value=p.kind(value or 0), step=p.kind(p.step or 1),
                format="%g" if p.kind is float else "%d", help=f"{p.help} Allowed: {p.range_text()}.", key=key,
                disabled=disabled)
        else:
            text = col.text_input(p.name, "" if value is None else str(value), help=p.help, key=key,
                                  disabled=disabled)
            values[p.name] = text or None
    if not m.params:
        st.caption("This method has no parameters.")
    return values


def start(sel: state.Selection, method: str, params: dict, out: str, shard: str, dtype: str | None,
          overwrite: bool, policy: str = "error") -> None:
    """Validate (parameters and the output placement rules), then hand the merge to the job manager."""
    from merging.placement import check_output_folder, input_folders
    from merging.side_files import is_side_file

    get_method(method).resolve_params(params)  # readable error for a bad value, before any thread starts
    check_output_folder(out, input_folders([sel.base, *sel.agents]), overwrite=overwrite, side_file_ok=is_side_file)
    spec = MergeSpec(sel.base, list(sel.agents), method, params, out.strip(), dtype, shard, on_mismatch=policy)
    job = jobs.manager().submit(spec, jobs.session_id(), overwrite=overwrite, counts=state.cached_counts(sel, spec))
    st.session_state[JOB_KEY] = job.id


def progress_panel(job: jobs.Job) -> None:
    """Live progress of a job; reruns the whole page once when it ends."""
    if job.running:
        p = job.progress
        if p is None:
            st.progress(0.0, text="Opening the models…")
        else:
            what = "Counting overlaps (for λ_t)" if job.phase == "count" else "Merging"
            eta = f" · ETA {format_seconds(p.eta)}" if p.eta is not None else ""
            st.progress(min(1.0, p.fraction),
                        text=f"{what}: {format_bytes(p.done)} of {format_bytes(p.total)} · tensors "
                             f"{p.tensors_done}/{p.tensors_total}{eta}")
        c = st.columns([1, 4])
        if c[0].button("Cancel merge", icon=":material/stop_circle:", key="cancel_merge",
                       disabled=job.owner != jobs.session_id()):
            jobs.manager().cancel(job.id)
            st.toast("Cancelling…")
        c[1].caption(f"Running for {format_seconds(job.elapsed)} into `{job.out}`. You can switch pages; "
                     "the merge keeps going.")
    elif st.session_state.get("_job_seen_running") == job.id:
        st.session_state["_job_seen_running"] = None
        st.rerun()


def results(job: jobs.Job, sel: state.Selection) -> None:
    if job.status == "cancelled":
        st.info("Merge cancelled; nothing was written.", icon=":material/cancel:")
        return
    if job.status == "failed":
        msg, hint = job.error or ("merge failed.", "")
        state.show_error(RamStudioError(msg, hint), "The merge")
        return
    res = job.result
    st.success(f"Merged into `{res.out}`: {len(res.files)} files, {format_bytes(res.bytes_written)} in "
               f"{res.seconds:.1f} s.", icon=":material/check_circle:")
    files = pd.DataFrame({"file": [f.name for f in res.files],
                          "size": [format_bytes(f.stat().st_size) if f.exists() else "missing" for f in res.files]})
    left, right = st.columns([2, 3])
    left.dataframe(files, hide_index=True, width="stretch")
    with right:
        if res.lambdas:
            st.markdown("**λ_t used**")
            st.dataframe(pd.DataFrame(res.lambdas), hide_index=True, width="stretch")
        for note in res.notes:
            st.caption(note)
    card, recipe = res.out / "README.md", res.out / "ram_recipe.json"
    stats = {"out": str(res.out), "seconds": res.seconds, "bytes_written": res.bytes_written,
             "files": [{"name": f.name, "bytes": f.stat().st_size} for f in res.files if f.exists()],
             "lambdas": res.lambdas, "notes": res.notes}
    c = st.columns(4)
    if card.exists():
        c[0].download_button("Model card", card.read_bytes(), "README.md", "text/markdown", key="dl_card",
                             icon=":material/description:", width="stretch")
    if recipe.exists():
        c[1].download_button("Recipe", recipe.read_bytes(), "ram_recipe.json", "application/json", key="dl_recipe",
                             icon=":material/receipt_long:", width="stretch")
    c[2].download_button("Statistics", json.dumps(stats, indent=2).encode(), "merge_stats.json", "application/json",
                         key="dl_stats", icon=":material/analytics:", width="stretch")
    if res.bytes_written <= ZIP_LIMIT:
        c[3].download_button("Zip of the model", lambda: zip_folder(res.out), f"{res.out.name}.zip",
                             "application/zip", key="dl_zip", icon=":material/folder_zip:", width="stretch")
    else:
        c[3].caption(f"No zip above {format_bytes(ZIP_LIMIT)}: copy the folder or push it to the Hub.")
    push_form(res.out)
    if sel.is_demo and importlib.util.find_spec("assets.demo.evaluate") is not None:
        evaluate_section(res.out, job.spec.method)


def zip_folder(folder: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(folder.iterdir()):
            if f.is_file():
                zf.write(f, f"{folder.name}/{f.name}")
    return buf.getvalue()


def push_form(folder: Path) -> None:
    """Optional upload; the token is used for this one call and never kept (the form clears it)."""
    with st.expander("Push to the Hugging Face Hub"):
        with st.form("push", clear_on_submit=True, border=False):
            repo = st.text_input("Repository id", placeholder="your-name/merged-agents")
            private = st.checkbox("Private repository", value=True)
            token = st.text_input("Token (leave empty to use HF_TOKEN or your saved login)", type="password")
            go = st.form_submit_button("Push", icon=":material/cloud_upload:")
        if go:
            with state.guard("The upload"):
                push(folder, repo.strip(), private, token or os.environ.get("HF_TOKEN") or None)
            del token


def push(folder: Path, repo: str, private: bool, token: str | None) -> None:
    import huggingface_hub as hf

    if not repo or "/" not in repo:
        raise RamStudioError("give the repository as owner/name.", "For example your-name/merged-agents.")
    try:
        api = hf.HfApi(token=token)
        api.create_repo(repo, private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo, commit_message="Upload merge from RAM Studio")
    except Exception as exc:  # noqa: BLE001 — the client's errors never contain the token; show one line
        from merging.hub import hub_error

        raise hub_error(repo, None, exc) from None
    st.success(f"Pushed to {getattr(info, 'commit_url', repo)}", icon=":material/cloud_done:")


def run_demo_eval(folder: Path) -> dict:
    """Worker-thread body: score a folder on the three demo tasks (test split)."""
    from assets.demo import evaluate
    from assets.demo.tasks import TASKS

    return evaluate.summary_row(evaluate.evaluate_model(folder, list(TASKS), split="test"))


def eval_panel(ev: jobs.EvalJob) -> None:
    """Polls the evaluation; when it ends, records the row and reruns the page once."""
    if ev.running:
        st.progress(min(0.95, ev.elapsed / 120), text=f"Evaluating on code, tool and memory… {ev.elapsed:.0f} s")
        return
    if st.session_state.get("_eval_seen") == ev.id:
        st.session_state["_eval_seen"] = None
        st.rerun()


def evaluate_section(folder: Path, method: str) -> None:
    st.subheader("Evaluate on the demo tasks")
    rows: dict = st.session_state.setdefault(EVAL_KEY, {})
    mgr = jobs.manager()
    ev = mgr.evals.get(st.session_state.get("eval_job") or "")
    busy = ev is not None and ev.running
    if st.button("Evaluate the merged model (test split)", icon=":material/science:", key="eval_merged",
                 disabled=busy):
        ev = mgr.submit_eval(folder, f"{method} (this session)", run_demo_eval)
        st.session_state["eval_job"] = ev.id
        busy = True
    if ev is not None and busy:
        st.session_state["_eval_seen"] = ev.id
        st.fragment(run_every=1.0)(eval_panel)(ev)
    elif ev is not None and ev.status == "failed":
        state.show_error(RamStudioError(*ev.error), "The evaluation")
    elif ev is not None and ev.status == "done" and ev.row is not None:
        rows[ev.label] = ev.row
    table = comparison_table(rows)
    if table is not None:
        st.dataframe(table, width="stretch")
        st.caption("Accuracy (%) on the demo's test split; rows marked 'this session' come from the button above, "
                   "the others from the demo build.")


def comparison_table(rows: dict) -> pd.DataFrame | None:
    frames = []
    try:
        measured, _source = state.demo_accuracy()
    except (OSError, ValueError, KeyError, pd.errors.ParserError):
        measured = None  # an unreadable results file only hides those rows
    if measured is not None:
        frames.append(measured)
    if rows:
        frames.append(pd.DataFrame(rows).T)
    return pd.concat(frames) if frames else None


# ---------------------------------------------------------------- page

st.title("Merge & export")
sel = state.selection()
if sel is None:
    state.no_selection_note()
    st.stop()

mgr = jobs.manager()
job = mgr.get(st.session_state.get(JOB_KEY))
mine_running = job is not None and job.running
other = mgr.running()
tuned = state.tuned()

st.markdown(f"Merge `{sel.base}` with {len(sel.agents)} agents. Parameters are pre-filled from **Tune**; the "
            "merge streams the weights in chunks and writes the folder atomically (no half model is ever left).")
names = list(METHODS)
method = st.selectbox("Method", names, index=names.index(default_method(tuned)), key="merge_method",
                      format_func=lambda n: f"{n} — {METHODS[n].summary}", disabled=mine_running)
params = param_widgets(method, tuned, mine_running)
c = st.columns([4.2, 1.2, 1.2, 1.2], vertical_alignment="bottom")
out = c[0].text_input("Output folder", value=default_out(sel, method), key=f"merge_out_{method}",
                      disabled=mine_running, help="Created if missing; must be empty unless you allow overwriting.")
shard = c[1].selectbox("Shard size", SHARD_SIZES, index=SHARD_SIZES.index("5GB"), key="merge_shard",
                       disabled=mine_running)
dtype = c[2].selectbox("Output dtype", list(DTYPES), key="merge_dtype", disabled=mine_running)
policy = c[3].selectbox("On mismatch", list(POLICIES), key="merge_policy", disabled=mine_running, help=POLICY_HELP)
row = st.container(horizontal=True, vertical_alignment="center")
go = row.button("Start merge", type="primary", icon=":material/play_arrow:", key="start_merge", disabled=mine_running)
overwrite = row.checkbox("Overwrite an existing folder", key="merge_overwrite", disabled=mine_running,
                         help="Replace a non-empty folder (only once the new one is complete).")
hub = [r for r in (sel.base, *sel.agents) if state.is_uncached_hub(r)]
if hub:
    st.info(f"{len(hub)} model(s) will be downloaded from the Hugging Face Hub before merging "
            "(see the size estimate on **Models**).", icon=":material/cloud_download:")
if other is not None and not mine_running:
    st.warning(f"Busy: another session is merging into `{other.out.name}` right now "
               f"({format_seconds(other.elapsed)} so far). One merge runs at a time per server.",
               icon=":material/hourglass_top:")
if go:
    st.session_state.pop(START_ERROR_KEY, None)  # a new attempt replaces the last error, never stacks on it
    try:
        start(sel, method, params, out, shard, DTYPES[dtype], overwrite, policy)
    except RamStudioError as exc:
        st.session_state[START_ERROR_KEY] = (exc.message, exc.hint)
    else:
        st.session_state["_job_seen_running"] = st.session_state[JOB_KEY]
        st.rerun()
if START_ERROR_KEY in st.session_state:
    state.show_error(RamStudioError(*st.session_state[START_ERROR_KEY]), "Starting the merge")
    st.stop()  # the last job's results belong to an earlier attempt: do not show them under this error

job = mgr.get(st.session_state.get(JOB_KEY))
if job is not None:
    st.divider()
    if job.running:
        st.session_state["_job_seen_running"] = job.id
        st.fragment(run_every=0.5)(progress_panel)(job)
    else:
        results(job, sel)

"""Merge & export: run a merge as a background job, follow it, then download / push / evaluate the result."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import streamlit as st

from app import charts, forms, frames, jobs, presets, state
from app.fisher_panel import fisher_runner, fisher_widgets
from app.forms import DTYPE_KEY, DTYPES, OUT_CUSTOM, POLICY_KEY, PRESET_KEY, RESCALE_KEY
from app.hub_push import push_form
from app.markup import md, md_code
from app.mergekit_panel import mergekit_panel
from app.tables import path_end, show_table
from app.viewport import content_width
from merging.common.errors import RamStudioError
from merging.common.units import format_bytes, format_seconds
from merging.methods import METHODS, get_method
from merging.presets import provenance as preset_provenance
from merging.reading.compat import POLICIES, POLICY_HELP
from merging.reading.vocab import VOCAB_CHOICES, VOCAB_HELP
from merging.recipe import MergeSpec
from merging.writing.written import read_bytes as read_written
from merging.writing.written import zip_bytes as zip_written

JOB_KEY = "merge_job"
START_ERROR_KEY = "merge_start_error"
START_WARNING_KEY = "merge_start_warning"
EVAL_KEY = "eval_rows"
EVAL_JOB_KEY = "eval_job"
OUT_KEY = "merge_out"  # the output folder box
DEFAULT_ROOT = "merged-models"  # never the README's `--out merged`, and never inside another model folder
ZIP_LIMIT = 300e6  # offer a zip download only below this size


def default_method(p: dict) -> str:
    return "ram_plus_soft" if p.get("rule") == "soft" else "ram_plus"


def default_out(sel: state.Selection, method: str, params: dict, dtype: str | None, policy: str,
                vocab: str = "base", untie: bool = False) -> str:
    """./merged-models/<base>-<method>-<hash of the settings>: one folder per distinct merge."""
    from merging.reading.refs import parse_ref
    from merging.writing.placement import suggest_output_name

    try:
        label = sel.demo_trio.rstrip(":") if sel.is_demo else parse_ref(sel.base).label
    except RamStudioError:
        label = "model"
    fields = {"base": sel.base, "agents": list(sel.agents), "method": method, "params": params,
              "out_dtype": dtype, "on_mismatch": policy,
              **({"vocab": vocab} if vocab != "base" else {}), **({"untie": True} if untie else {})}
    return str(Path.cwd() / DEFAULT_ROOT / suggest_output_name(label, fields))


def init(key: str, value) -> None:
    """Give a widget its starting value through session state (so a loaded YAML can set it too)."""
    if key not in st.session_state:
        st.session_state[key] = value


def param_widgets(method: str, tuned: dict, disabled: bool) -> dict:
    """One input per method parameter, built from its declaration and pre-filled from the Tune page."""
    m = get_method(method)
    values = {}
    cols = st.columns(max(1, min(4, len(m.params))))
    for i, p in enumerate(m.params):
        key = forms.param_key(method, p.name)
        value = tuned.get(p.name, p.default)
        col = cols[i % len(cols)]
        if p.choices:
            init(key, value if value in p.choices else p.choices[0])
            values[p.name] = col.selectbox(p.title, list(p.choices), help=p.help, key=key, disabled=disabled)
        elif p.kind is bool:
            init(key, bool(value))
            values[p.name] = col.checkbox(p.title, help=p.help, key=key, disabled=disabled)
        elif p.kind in (int, float):
            lo = None if p.low is None else p.kind(p.low)
            hi = None if p.high is None or p.high_open else p.kind(p.high)
            init(key, p.kind(value or 0))
            values[p.name] = col.number_input(
                p.title, min_value=lo, max_value=hi, step=p.kind(p.step or 1),
                format="%g" if p.kind is float else "%d", help=f"{p.help} Allowed: {p.range_text()}.", key=key,
                disabled=disabled)
        else:
            init(key, "" if value is None else str(value))
            text = col.text_input(p.title, help=p.help, key=key, disabled=disabled)
            values[p.name] = text or None
    if not m.params:
        st.caption("This method has no parameters.")
    return values


def start(sel: state.Selection, method: str, params: dict, out: str, shard: str, dtype: str | None,
          overwrite: bool, policy: str = "error", vocab: str = "base", untie: bool = False, fisher=None) -> None:
    """Validate (parameters and the output placement rules), then hand the merge to the job manager (for Fisher
    merging, a job that runs the Fisher pass first: app/fisher_panel.py)."""
    from merging.writing.placement import check_output_folder, input_folders
    from merging.writing.side_files import is_side_file

    get_method(method).resolve_params(params)  # readable error for a bad value, before any thread starts
    target = check_output_folder(out, input_folders([sel.base, *sel.agents]), overwrite=overwrite,
                                 side_file_ok=is_side_file)
    st.session_state[START_WARNING_KEY] = target.warnings  # e.g. an output inside the Hugging Face cache
    spec = MergeSpec(sel.base, list(sel.agents), method, params, out.strip(), dtype, shard, on_mismatch=policy,
                     vocab=vocab, untie=untie)
    counts, overlap = state.cached_statistics(sel, spec) if not untie else (None, None)
    chosen = st.session_state.get(PRESET_KEY, presets.CUSTOM)
    provenance = None if chosen == presets.CUSTOM else preset_provenance(chosen, method, params)
    job = jobs.manager().submit(
        "merge", jobs.session_id(), f"a merge into {Path(spec.out).name}",
        lambda j: run_merge(spec, j, fisher, overwrite=overwrite, counts=counts, overlap=overlap,
                            provenance=provenance),
        merges=True, out=Path(spec.out), request=spec, hint="Check the output folder and the inputs, then try again.")
    jobs.remember(JOB_KEY, "merge", job.id)


def run_merge(spec: MergeSpec, job: jobs.Job, fisher=None, **options):
    """Worker: the merge (merging.merge.merge_to_folder; for Fisher merging the Fisher pass first), its progress on
    the job (detail: the Progress; text: the phase, the Fisher pass, counting overlaps or merging)."""
    from merging.merge import merge_to_folder

    def on(phase: str):
        return lambda p: job.report(p.fraction, phase, p)

    runner = merge_to_folder if fisher is None else fisher_runner(fisher)
    return runner(spec, progress=on("Merging"), count_progress=on("Counting overlaps (for λ_t)"),
                  cancel=job.cancel, **options)


def progress_panel(job: jobs.Job) -> None:
    """Live progress of the running merge (drawn by jobs.poll every 0.5 s)."""
    p = job.detail
    if p is None:
        st.progress(0.0, text="Opening the models…")
    elif p.phase == "fisher":  # the Fisher pass before a Fisher merge: examples, not bytes
        st.progress(min(1.0, p.fraction), text=f"Fisher pass: {md(p.tensor)} · {format_seconds(p.elapsed)}")
    else:
        eta = f" · ETA {format_seconds(p.eta)}" if p.eta is not None else ""
        st.progress(min(1.0, p.fraction),
                    text=f"{job.text}: {format_bytes(p.done)} of {format_bytes(p.total)} · tensors "
                         f"{p.tensors_done}/{p.tensors_total}{eta}")


CANCEL_MERGE = jobs.CancelButton("Cancel merge", "cancel_merge", caption=lambda job: (
    f"Running for {format_seconds(job.elapsed)} into {md_code(job.out)}. You can switch pages; the merge keeps going."))


def results(job: jobs.Job, sel: state.Selection) -> None:
    if not jobs.ending(job, "The merge", cancelled="Merge cancelled; nothing was written."):
        return
    res = job.result
    written = res.written  # what the merge committed: downloads read exactly that, never the path again
    st.success(f"Merged into {md_code(res.out)}: {len(res.files)} files, {format_bytes(res.bytes_written)} in "
               f"{res.seconds:.1f} s.", icon=":material/check_circle:")
    files = pd.DataFrame({"file": [f.name for f in res.files],
                          "size": [format_bytes(f.stat().st_size) if f.exists() else "missing" for f in res.files]})
    (left, right), shares = charts.beside([2, 3], [260, 380])
    with left:
        show_table(files, width_share=shares[0])
    with right:
        if res.lambdas:
            st.markdown("**λ_t used**")
            show_table(frames.lambdas_frame(res.lambdas), width_share=shares[1])
        for line in res.lineage:
            st.warning(md(line), icon=":material/family_history:")
        for note in res.notes:
            st.caption(md(note))
    stats = {"out": str(res.out), "seconds": res.seconds, "bytes_written": res.bytes_written,
             "files": [{"name": f.name, "bytes": f.size, "sha256": f.sha256} for f in written.files],
             "lambdas": res.lambdas, "notes": res.notes,
             **({"overlap": {k: v for k, v in res.overlap.items() if k != "markdown"}} if res.overlap else {})}
    c = st.columns(4)
    for col, name, label, mime, key, icon in ((c[0], "README.md", "Model card", "text/markdown", "dl_card",
                                               ":material/description:"),
                                              (c[1], "ram_recipe.json", "Recipe", "application/json", "dl_recipe",
                                               ":material/receipt_long:")):
        if written.file(name) is not None:
            with state.guard(f"Reading the {label.lower()}"):
                col.download_button(label, read_written(written, name), name, mime, key=key, icon=icon,
                                    width="stretch")
    c[2].download_button("Statistics", json.dumps(stats, indent=2).encode(), "merge_stats.json", "application/json",
                         key="dl_stats", icon=":material/analytics:", width="stretch")
    if res.bytes_written <= ZIP_LIMIT:
        c[3].download_button("Zip of the model", lambda: zip_written(written), f"{res.out.name}.zip",
                             "application/zip", key="dl_zip", icon=":material/folder_zip:", width="stretch")
    else:
        c[3].caption(f"No zip above {format_bytes(ZIP_LIMIT)}: copy the folder or push it to the Hub.")
    push_form(written)
    if sel.is_demo and importlib.util.find_spec("demo.evaluate") is not None:
        evaluate_section(res.out, job.request.method, sel.demo_trio)


def run_demo_eval(folder: Path, job: jobs.Job) -> dict:
    """Worker: score a folder on the demo tasks (test split), its progress on the job (detail: examples scored
    and in all)."""
    from demo.evaluate import score_all_tasks

    def progress(done: int, total: int, text: str) -> None:
        job.report(done / total if total else 0.0, text, (done, total))

    return score_all_tasks(folder, "test", progress)


def eval_panel(ev: jobs.Job) -> None:
    """Progress of the running evaluation (drawn by jobs.poll every second)."""
    done, total = ev.detail or (0, 0)
    eta = ""
    if done:
        eta = f" · about {format_seconds(ev.elapsed / done * (total - done))} left"
    st.progress(ev.fraction, text=f"Evaluating: {done} of {total or '…'} examples scored"
                                  f"{' · ' + md(ev.text) if ev.text else ''} · {format_seconds(ev.elapsed)}{eta}")


def evaluate_section(folder: Path, method: str, trio: str | None = None) -> None:
    st.subheader("Evaluate on the demo tasks")
    rows: dict = st.session_state.setdefault(EVAL_KEY, {})
    mgr = jobs.manager()
    ev = mgr.get(st.session_state.get(EVAL_JOB_KEY))
    busy = ev is not None and ev.running
    if st.button("Evaluate the merged model (test split)", icon=":material/science:", key="eval_merged",
                 disabled=busy):
        ev = mgr.submit("eval", jobs.session_id(), f"{method} (this session)", lambda j: run_demo_eval(folder, j),
                        exclusive=False, key=str(folder), hint="Is this a model built from the demo base? Only those "
                                                               "can be scored on the demo tasks.")
        st.session_state[EVAL_JOB_KEY] = ev.id
        busy = True
    if ev is not None and busy:
        jobs.poll(ev, eval_panel)
    elif ev is not None and jobs.ending(ev, "The evaluation") and ev.result is not None:
        rows.pop(ev.label, None)
        rows[ev.label] = ev.result  # the newest evaluation goes last here, first in the table
    table = comparison_table(rows, trio)
    if table is not None:
        from demo.evaluate import with_stderr

        table = with_stderr(table)
        fresh = list(reversed(rows))
        show_table(table.style.apply(lambda r: ["background-color: rgba(0,114,178,0.15)" if r.name in fresh
                                                else "" for _ in r], axis=1).format(precision=2),
                   index=True, height=38 + 35 * len(table))  # every row visible; model names never cut
        st.caption("Accuracy (%) ± one standard error on the demo's test split (binomial per task, √(Σ se²)/3 for "
                   "the average). Highlighted rows at the top come from the button above "
                   "(newest first); the others from the demo build.")


def comparison_table(rows: dict, trio: str | None = None) -> pd.DataFrame | None:
    """This session's evaluations (newest first) above the measured rows of the selected demo trio's build."""
    from demo.evaluate import comparison_table as table

    try:
        measured, _source = state.demo_accuracy(trio) if trio else (None, "")
    except (OSError, ValueError, KeyError, pd.errors.ParserError):
        measured = None  # an unreadable results file only hides those rows
    return table(rows, measured)


def apply_preset_to_form() -> None:
    """Set the method and its r, α and ρ scope from the chosen preset (ε and the rest stay)."""
    picked = presets.chosen(PRESET_KEY, RESCALE_KEY)
    if picked is None:
        return
    preset, params = picked
    forms.fill_merge_form(preset.method, params)


def preset_row(tuned: dict, disabled: bool) -> None:
    """A named setting for the form (the paper's RAM+, the authors' script's two modes, mergekit's defaults);
    starts from the one chosen on Tune."""
    init(PRESET_KEY, tuned.get("preset", presets.CUSTOM))
    if tuned.get("rescale_factor"):
        init(RESCALE_KEY, float(tuned["rescale_factor"]))
    presets.picker(PRESET_KEY, RESCALE_KEY, apply_preset_to_form, "custom (the form below)",
                   "Fills the method and its r, α and ρ scope; ε stays.", disabled=disabled)


# ---------------------------------------------------------------- page

st.title("Merge & export")
sel = state.selection_or_stop()

mgr = jobs.manager()
job = jobs.follow(JOB_KEY, "merge")
# One look at the job for the whole page: the form, the progress panel and the results all follow it, and
# the progress fragment redraws the page as soon as the job is no longer running. A merge this session only
# follows (another open session started it) disables nothing here: that session's Busy rule applies.
job_running = job is not None and job.running
mine_running = job_running and job.owner == jobs.session_id()
other = mgr.running()
tuned = state.tuned()

st.markdown(f"Merge {md_code(path_end(sel.base))} with {len(sel.agents)} agents. Parameters are pre-filled from "
            "**Tune**; the merge streams the weights in chunks and writes the folder atomically (no half model is "
            "ever left).")
names = list(METHODS)
preset_row(tuned, mine_running)
init(forms.METHOD_KEY, default_method(tuned))
method = st.selectbox("Method", names, key=forms.METHOD_KEY, format_func=lambda n: f"{n} — {METHODS[n].summary}",
                      disabled=mine_running)
params = param_widgets(method, tuned, mine_running)
fisher = fisher_widgets(sel, mine_running) if get_method(method).side_tensors == "fisher" else None
if method == "task_arithmetic":  # Tune's "how much of each unique update survives" starts from this λ
    st.session_state[forms.TA_LAMBDA_KEY] = float(params["lambda"])
if st.session_state.get(PRESET_KEY, presets.CUSTOM) != presets.CUSTOM:
    try:
        matches = preset_provenance(st.session_state[PRESET_KEY], method, params) is not None
    except RamStudioError:
        matches = False
    if not matches:
        st.caption(f"The form no longer matches preset {st.session_state[PRESET_KEY]}: the merge will be recorded "
                   "with its own parameters only.")
init(forms.SHARD_KEY, "5GB")
init(DTYPE_KEY, "as base")
init(POLICY_KEY, "error")
suggested = default_out(sel, method, params, DTYPES[st.session_state[DTYPE_KEY]], st.session_state[POLICY_KEY],
                        st.session_state.get("merge_vocab", "base"), bool(st.session_state.get("merge_untie")))
custom = st.session_state.get(OUT_CUSTOM)
st.session_state[OUT_KEY] = custom or suggested


def _typed_out() -> None:
    typed = st.session_state[OUT_KEY].strip()
    st.session_state[OUT_CUSTOM] = typed if typed and typed != suggested else None


# the folder beside the three choices when each choice gets ~130 px (its label and value whole), else on a row above
c = (st.columns([4.2, 1.2, 1.2, 1.2], vertical_alignment="bottom") if content_width() >= 900 else
     [st.container(), *st.columns(3, vertical_alignment="bottom")])
out = c[0].text_input("Output folder", key=OUT_KEY, on_change=_typed_out, disabled=mine_running,
                      help="Created if missing; must be empty unless you allow overwriting. The suggestion is "
                           f"./{DEFAULT_ROOT}/<base>-<method>-<hash of the settings>: one folder per distinct merge, "
                           "never inside another model's folder.")
shard = c[1].selectbox("Shard size", forms.SHARD_SIZES, key=forms.SHARD_KEY, disabled=mine_running)
dtype = c[2].selectbox("Output dtype", list(DTYPES), key=DTYPE_KEY, disabled=mine_running)
policy = c[3].selectbox("On mismatch", list(POLICIES), key=POLICY_KEY, disabled=mine_running, help=POLICY_HELP)
v = st.columns([3.2, 1.8], vertical_alignment="bottom")
vocab = v[0].radio("Vocabulary", list(VOCAB_CHOICES), key="merge_vocab", horizontal=True, disabled=mine_running,
                   format_func=lambda c: {"base": "the base's", "union": "union (keep added tokens)"}[c],
                   help=VOCAB_HELP + ".")
untie = v[1].checkbox("Untie the head", key="merge_untie", disabled=mine_running,
                      help="For a tied base whose agents stored an lm_head untied by training: write an untied head, "
                           "merged from the base's embeddings and each agent's head (tie_word_embeddings false).")
if custom:
    note = st.container(horizontal=True, vertical_alignment="center")
    note.caption(f"Your folder. Suggested for these settings: {md_code(path_end(suggested, 60))}")
    if note.button("Use the suggestion", key="merge_out_reset", type="tertiary", disabled=mine_running):
        st.session_state[OUT_CUSTOM] = None
        st.rerun()
row = st.container(horizontal=True, vertical_alignment="center")
go = row.button("Start merge", type="primary", icon=":material/play_arrow:", key="start_merge", disabled=mine_running)
overwrite = row.checkbox("Overwrite an existing folder", key="merge_overwrite", disabled=mine_running,
                         help="Replace a non-empty folder (only one RAM Studio wrote, and only once the new one is "
                              "complete).")
hub = [r for r in (sel.base, *sel.agents) if state.is_uncached_hub(r)]
if hub:
    from app import downloads

    with st.container(border=True):
        st.markdown(f"**{len(hub)} of the models are on the Hugging Face Hub and not downloaded yet.** Download them "
                    "first; the merge then reads them from the local cache.")
        downloads.panel(hub, what="the merge")
if other is not None and not mine_running:
    who = "this session" if other.owner == jobs.session_id() else "another session"
    st.warning(f"Busy: {who} is running {md(other.label)} right now ({format_seconds(other.elapsed)} so far). "
               "One merge runs at a time per server.", icon=":material/hourglass_top:")
mergekit_panel(MergeSpec(sel.base, list(sel.agents), method, params, out.strip(), DTYPES[dtype], shard,
                         on_mismatch=policy, vocab=vocab, untie=untie))
if go:
    st.session_state.pop(START_ERROR_KEY, None)  # a new attempt replaces the last error, never stacks on it
    try:
        if hub:
            raise RamStudioError(f"{len(hub)} Hub model(s) are not downloaded yet.",
                                 "Start the download above; the merge reads them from the local cache.")
        start(sel, method, params, out, shard, DTYPES[dtype], overwrite, policy, vocab, untie, fisher)
    except RamStudioError as exc:
        st.session_state[START_ERROR_KEY] = (exc.message, exc.hint)
    else:
        st.rerun()
if START_ERROR_KEY in st.session_state:
    state.show_error(RamStudioError(*st.session_state[START_ERROR_KEY]), "Starting the merge")
    if not job_running:  # a merge still running (another session's, followed here) keeps its progress below
        st.stop()  # the last job's results belong to an earlier attempt: do not show them under this error

for message in st.session_state.get(START_WARNING_KEY) or []:
    st.warning(md(message), icon=":material/warning:")
if job is not None:
    st.divider()
    if job_running:  # the same look at the job as the form's: never a disabled form without this panel
        jobs.poll(job, progress_panel, every=0.5, cancel=CANCEL_MERGE)
    else:
        results(job, sel)

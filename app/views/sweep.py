"""Sweep: score merge candidates on the selected models and choose among them — each method's best on the
validation split, only the chosen ones (with the base and the agents) on test. The workflow is
evaluation.sweep; this page picks the candidates, runs it as a background job and draws the results."""
from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from app import jobs, state
from app.sweep_results import entries_frame, results
from app.tables import show_table
from evaluation.grid import Grid, grids_from_yaml, parse_try, stages
from evaluation.sweep import SweepResult
from merging.common.errors import RamStudioError, printable
from merging.common.units import format_seconds
from merging.methods import METHODS, get_method

JOB_KEY = "sweep_job"
GRIDS_KEY = "sweep_grids"  # the grids, in the --try form
MSG_KEY = "sweep_grid_message"
TABLE2 = "ram_plus r=0,0.05,0.1,0.15,0.2"  # the paper's Table 2 ablation over r
GRID_FILE = "table1_grids.yaml"  # the demo's Table 1 search (the paper's Table 11 ranges, λ past 1)
# Value lists the value boxes start from (the paper's grids, Table 11 / Table 2); other parameters start at
# their default.
START_VALUES = {"lambda": "0.1, 0.3, 0.5, 0.7, 0.9, 1.0", "density": "0.1, 0.2, 0.3", "drop_rate": "0.1, 0.3, 0.5",
                "r": "0, 0.05, 0.1, 0.15, 0.2", "fisher_examples": "256, 512, 1024, 2048"}


def grids() -> list[str]:
    return st.session_state.setdefault(GRIDS_KEY, [])


def parsed() -> list[Grid]:
    """The page's grids, checked (a bad one was never added)."""
    return [parse_try(t) for t in grids()]


# ---------------------------------------------------------------- picking candidates

def value_widgets(method: str, disabled: bool) -> str:
    """One input per parameter of `method`, generated from its declaration: a list of values (or @METHOD);
    returns the grid in the `--try` form."""
    m = get_method(method)
    words = [method]
    cols = st.columns(max(1, min(4, len(m.params))))
    others = [n for n in METHODS
              if n != method and any(p.name in {q.name for q in METHODS[n].params} for p in m.params)]
    for i, p in enumerate(m.params):
        key = f"sweep_{method}_{p.name}"
        col = cols[i % len(cols)]
        if p.choices or p.kind is bool:
            options = list(p.choices) if p.choices else [False, True]
            picked = col.multiselect(p.name, options, default=[p.default] if p.default is not None else [],
                                     help=p.help, key=key, disabled=disabled)
            if picked:
                words.append(f"{p.name}={','.join(str(v) for v in picked)}")
            continue
        start = START_VALUES.get(p.name, "" if p.default is None else str(p.default))
        if p.name == "seed":
            start = str(p.default)
        text = col.text_input(p.name, value=start, key=key, disabled=disabled,
                              help=f"{p.help} Allowed: {p.range_text()}. Several values: comma-separated. "
                                   + (f"`@METHOD` takes the value chosen for METHOD (e.g. @{others[0]})."
                                      if others else ""))
        if text.strip():
            words.append(f"{p.name}={text.replace(' ', '')}")
    if not m.params:
        st.caption("This method has no parameters: one candidate.")
    return " ".join(words)


def add_grid(text: str) -> None:
    """Button callback: check the grid (one rule with the CLI's --try) and add it, or say why not."""
    try:
        g = parse_try(text)
    except RamStudioError as exc:
        st.session_state[MSG_KEY] = (exc.message, exc.hint)
        return
    st.session_state.pop(MSG_KEY, None)
    if g.text not in grids():
        grids().append(g.text)


def load_grids(texts: list[str]) -> None:
    st.session_state[GRIDS_KEY] = list(texts)
    st.session_state.pop(MSG_KEY, None)


def load_yaml() -> None:
    """Button callback: replace the grids with those of the YAML box (same reader as the CLI's --grids)."""
    try:
        load_grids([g.text for g in grids_from_yaml(st.session_state.get("sweep_yaml", ""), "the YAML")])
    except RamStudioError as exc:
        st.session_state[MSG_KEY] = (exc.message, exc.hint)


def demo_grid_texts() -> list[str]:
    from demo.table1 import GRIDS
    from evaluation.grid import read_grid_file

    return [g.text for g in read_grid_file(GRIDS)]


def candidates_section(disabled: bool, sel: state.Selection) -> None:
    st.subheader("Candidates")
    c = st.container(horizontal=True)
    c.button("The paper's search (Table 11)", key="sweep_preset_table11", disabled=disabled,
             icon=":material/table_chart:", on_click=lambda: load_grids(demo_grid_texts()),
             help=f"The demo's mini Table 1 search ({GRID_FILE}, the paper's Table 11 ranges with λ extended past "
                  "the paper's 1.0 to 1.2, 1.5 and 2.0): TA λ; TIES λ × density; DARE's drop rate at the chosen λ; "
                  "Fisher λ × N; averaging, RAM and RAM+ at their defaults.")
    c.button("Ablation over r (Table 2)", key="sweep_preset_table2", disabled=disabled, icon=":material/tune:",
             on_click=lambda: load_grids([TABLE2]), help=f"`{TABLE2}`: RAM (r = 0) and RAM+ at four strengths.")
    c.button("Clear", key="sweep_clear", disabled=disabled, icon=":material/delete_sweep:",
             on_click=lambda: load_grids([]))
    checked = parsed()
    if checked:
        rows = pd.DataFrame({"grid": [g.text for g in checked], "candidates": [g.size() for g in checked]})
        show_table(rows)
        remove = st.columns([3, 1], vertical_alignment="bottom")
        gone = remove[0].selectbox("Remove a grid", [g.text for g in checked], key="sweep_remove_pick",
                                   disabled=disabled)
        if remove[1].button("Remove", key="sweep_remove", disabled=disabled, icon=":material/remove:"):
            grids().remove(gone)
            st.rerun()
    else:
        st.caption("No candidates yet: start from a preset above or add a grid below.")
    with st.expander("Add a grid", expanded=not checked):
        method = st.selectbox("Method", list(METHODS), key="sweep_method", disabled=disabled,
                              format_func=lambda n: f"{n} — {METHODS[n].summary}")
        text = value_widgets(method, disabled)
        st.code(text, language=None)
        st.button("Add this grid", key="sweep_add", icon=":material/add:", disabled=disabled,
                  on_click=add_grid, args=(text,))
    with st.expander("Grids as YAML (the CLI's --grids file)"):
        st.code("grids:\n" + "".join(f"  - {json.dumps(t)}\n" for t in grids()) if grids() else "grids: []",
                language="yaml")
        st.text_area("Paste grids (YAML) to replace these", key="sweep_yaml", height=120,
                     placeholder="grids:\n  - method: ties\n    lambda: [0.5, 1.0]\n    density: [0.1, 0.2]")
        st.button("Load the pasted grids", key="sweep_yaml_load", icon=":material/upload:", on_click=load_yaml,
                  disabled=disabled)
    msg = st.session_state.get(MSG_KEY)
    if msg:
        state.show_error(RamStudioError(*msg), "That grid")


# ---------------------------------------------------------------- running

EVALUATORS = ("Demo tasks", "lm-evaluation-harness")


@st.cache_resource(show_spinner="Reading the lm-eval task index…", max_entries=8)
def lm_eval_evaluator(tasks: tuple[str, ...], include_path: str):
    """An lm-eval evaluator for these tasks (building one reads the harness's task index: kept per server)."""
    from evaluation.lm_eval_backend import LmEvalEvaluator

    return LmEvalEvaluator(list(tasks), include_path or None)


def evaluator_section(sel: state.Selection, disabled: bool):
    """The demo's tasks or lm-evaluation-harness tasks, and how many examples per task; returns (evaluator or
    None, limit)."""
    st.subheader("Evaluation")
    c = st.columns([3, 1])
    kind = c[0].radio("Evaluator", EVALUATORS, index=0 if sel.is_demo else 1, horizontal=True, key="sweep_evaluator",
                      disabled=disabled, help="The demo's tasks score only models built from the demo base (its "
                                              "tokenizer and tasks); lm-evaluation-harness scores any causal LM.")
    limit = c[1].number_input("Examples per task (0: all)", min_value=0, value=0, step=10, key="sweep_limit",
                              disabled=disabled, help="Fewer examples: a faster, noisier sweep.")
    limit = int(limit) or None
    if kind == EVALUATORS[1]:
        c = st.columns(2)
        names = c[0].text_input("lm-eval tasks (comma-separated)", key="sweep_lm_tasks", disabled=disabled,
                                placeholder="e.g. arc_easy,hellaswag — or ram_demo_tool with the demo's task folder",
                                help="Task or group names. Selection needs a validation split apart from the one "
                                     "reported (a task's own, or a TASK_validation task in the include path).")
        include = c[1].text_input("Include path (optional)", key="sweep_lm_include", disabled=disabled,
                                  placeholder="a folder of task YAML files, e.g. assets/demo/lm_eval_tasks")
        tasks = tuple(t.strip() for t in names.split(",") if t.strip())
        if not tasks:
            st.caption("Name at least one lm-eval task.")
            return None, limit
        try:
            return lm_eval_evaluator(tasks, include.strip()), limit
        except ImportError:
            st.info("lm-evaluation-harness is not installed: `pip install 'ram-studio[eval]'`.", icon=":material/info:")
        except RamStudioError as exc:
            state.show_error(exc, "The lm-eval tasks")
        return None, limit
    from demo.evaluate import suite_of_folder
    from demo.evaluator import DemoEvaluator
    from merging.reading.refs import resolve

    try:
        suite = suite_of_folder(resolve(sel.base, download=False))
    except (RamStudioError, ValueError) as exc:
        st.info(f"The demo's tasks cannot score these models: {printable(exc, 200)}", icon=":material/info:")
        return None, None
    tasks = st.multiselect("Demo tasks", list(suite.tasks), default=list(suite.tasks), key="sweep_tasks",
                           disabled=disabled, help=f"Task suite: {suite.name} ({suite.description}).")
    if not tasks:
        st.warning("Choose at least one task.", icon=":material/warning:")
        return None, None
    return DemoEvaluator(tasks, suite=suite), limit


def fisher_tasks_input(texts: list[str], disabled: bool) -> list[str] | None:
    """Each agent's own task for Fisher candidates (shown when a grid is Fisher's; empty: by the agents' names)."""
    from evaluation.fisher import reads_fisher

    if not any(reads_fisher(t.split()[0]) for t in texts if t.split()):
        return None
    text = st.text_input("Fisher: each agent's own task among the evaluator's, in the agents' order",
                         key="sweep_fisher",
                         disabled=disabled, placeholder="empty: the task named like each agent (code → code, or "
                                                        "ram_demo_code)",
                         help="Each agent's Fisher is computed on its own task's train split, once per N and rule, "
                              "inside the sweep (kept in the analysis cache).")
    return [t.strip() for t in text.split(",") if t.strip()] or None


def run_job(sel: state.Selection, texts: list[str], evaluator, limit: int | None, job: jobs.Job,
            fisher_tasks: list[str] | None = None) -> SweepResult:
    """Worker: the sweep (evaluation.executors.run_local), its progress on the job (the fraction, a line, the
    entries so far)."""
    from evaluation.executors import run_local

    def progress(p) -> None:
        examples = f" ({p.examples_done}/{p.examples_total} examples)" if p.examples_total and p.phase != "open" else ""
        phase = {"open": "Opening the models", "select": "Validation", "report": "Test", "done": "Done"}[p.phase]
        job.report(p.fraction, f"{phase}: {p.done} of {p.total} scored{examples}"
                   + (f" · {p.current}" if p.current else ""), p.entries)

    return run_local(sel.base, list(sel.agents), texts, evaluator, limit, progress=progress, cancel=job.cancel,
                     fisher_tasks=fisher_tasks)


CANCEL_SWEEP = jobs.CancelButton("Cancel sweep", "sweep_cancel", caption="Every score is kept as it comes: starting "
                                 "the same sweep again resumes from them. You can switch pages meanwhile.")


def progress_panel(job: jobs.Job) -> None:
    """The running sweep (drawn by jobs.poll every second): bar, line, the scores so far."""
    st.progress(min(1.0, job.fraction), text=f"{job.text or 'Starting'} · {format_seconds(job.elapsed)}")
    entries = job.detail or []
    if entries:
        live = entries_frame(entries)
        show_table(live, key="sweep_live")


# ---------------------------------------------------------------- page

st.title("Sweep")
st.markdown("What does a setting do to the merged model's **scores**? Each candidate is merged in memory (bit for bit "
            "the model `ram-studio merge` would write) and scored on the **validation** split; each method's best is "
            "then scored on **test**, next to the base and the agents — settings are never chosen on test (the "
            "paper's protocol, Appendix D.2).")
sel = state.selection_or_stop()
mgr = jobs.manager()
task = jobs.follow(JOB_KEY, "sweep")
running = task is not None and task.running
candidates_section(running, sel)
evaluator, limit = evaluator_section(sel, running)
texts = list(grids())
n = 0
if texts:
    try:
        plan = stages(parsed())
        n = sum(g.size() for stage in plan for g in stage)
    except RamStudioError as exc:
        state.show_error(exc, "These grids")
        texts = []
fisher_tasks = fisher_tasks_input(texts, running)
row = st.container(horizontal=True, vertical_alignment="center")
go = row.button("Start sweep", type="primary", icon=":material/play_arrow:", key="sweep_start",
                disabled=running or not texts or evaluator is None)
row.caption(f"{n} candidates on validation, then each method's best on test." if texts else "")
if go:
    try:
        from evaluation.sweep import check_splits

        check_splits(evaluator, "validation", "test")  # e.g. lm-eval tasks without a validation split: said now
        task = mgr.submit("sweep", jobs.session_id(), f"a sweep of {n} candidates",
                          lambda j, s=sel, g=texts, e=evaluator, k=limit, f=fisher_tasks: run_job(s, g, e, k, j, f))
    except RamStudioError as exc:
        state.show_error(exc, "Starting the sweep")
    else:
        jobs.remember(JOB_KEY, "sweep", task.id)
        st.rerun()
if task is not None:
    st.divider()
    if running:
        jobs.poll(task, progress_panel, cancel=CANCEL_SWEEP)
    elif jobs.ending(task, "The sweep", cancelled=f"Sweep cancelled; {len(task.detail or [])} scores were kept: start "
                                                  "it again to resume from them.") and task.result is not None:
        results(task.result, sel)

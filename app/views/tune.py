"""Tune: RAM+ parameters against the cached overlap statistics — no weights are re-read — and two settings
side by side (A | B)."""
from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from analysis import tables
from app import charts, frames, jobs, presets, state
from app.forms import TA_LAMBDA_KEY
from app.tables import csv_later
from merging.common.errors import RamStudioError, printable
from merging.common.units import format_seconds
from merging.methods import get_method, regions

st.title("Tune")
st.markdown("RAM+ scales each agent's **unique** update by λ_t = 1 + r·clip(ρ_t, 0, α) (Eq. 6), or "
            "1 + r·ρ_t/(1+ρ_t) with the soft rule (Eq. 8), where ρ_t = shared_t / unique_t (Eq. 2). The RAM "
            "authors' public script uses neither by default: its presets below map its two modes onto r and α. "
            "Everything below is recomputed from the cached counts, so it updates instantly. ρ and λ per layer, "
            "module and tensor are on **Heterogeneity**.")

sel = state.selection()
res = state.analysis_or_stop(sel)
SCOPES = ["global", "tensor"]


def _start(key: str, value):
    """A widget's starting value, unless session state already holds one (set by a preset: passing both
    makes Streamlit warn)."""
    return {} if key in st.session_state else {"value": value}


def setting_widgets(prefix: str, p: dict, ladder: list[float], cols, on_change=None) -> dict:
    """ε, r, α, rule and scope inputs (keys `<prefix>_eps` …), starting from `p`; labelled as the methods
    declare them (the Merge form shows the same labels)."""
    label = {q.name: q.title for q in get_method("ram_plus").params}
    eps = cols[0].select_slider(label["eps"], options=ladder, format_func=charts.eps_label,
                                key=f"{prefix}_eps", **_start(f"{prefix}_eps", p["eps"] if p["eps"] in ladder
                                                              else ladder[0]))
    r = cols[1].slider(label["r"], 0.0, 1.0, step=0.01, key=f"{prefix}_r", on_change=on_change,
                       help="Paper: r = 0.1. r = 0 is plain RAM. The authors' script: r = R − 1.",
                       **_start(f"{prefix}_r", float(p["r"])))
    if f"{prefix}_rule" not in st.session_state:
        st.session_state[f"{prefix}_rule"] = p["rule"]
    if f"{prefix}_scope" not in st.session_state:
        st.session_state[f"{prefix}_scope"] = p["rho_scope"]
    rule = cols[3].radio("λ rule", list(regions.RULES), horizontal=True, key=f"{prefix}_rule", on_change=on_change,
                         help="clip: Eq. 6 (RAM+). soft: Eq. 8 (RAM+s), no α.")
    alpha = cols[2].slider(label["alpha"], 0.0, 5.0, step=0.1, key=f"{prefix}_alpha", on_change=on_change,
                           disabled=rule == "soft", help="Paper: α = 2.0. Only used by the clip rule.",
                           **_start(f"{prefix}_alpha", float(p["alpha"])))
    scope = cols[4].radio(label["rho_scope"], SCOPES, horizontal=True, key=f"{prefix}_scope", on_change=on_change,
                          help="global: ρ_t over the whole model (paper). tensor: per tensor (mergekit ramplus_tl).")
    return {"eps": eps, "r": r, "alpha": alpha, "rule": rule, "rho_scope": scope}


def _apply_preset() -> None:
    """Set the tuner's r, α, rule and scope from the chosen preset (ε stays), before the widgets are drawn."""
    picked = presets.chosen("tune_preset", "tune_rescale")
    if picked is None:
        return
    preset, params = picked
    values = {"r": float(params["r"]), "rule": "soft" if preset.method == "ram_plus_soft" else "clip",
              "rho_scope": params["rho_scope"]}
    if "alpha" in params:
        values["alpha"] = float(params["alpha"])
    for k, v in values.items():
        st.session_state[f"tune_{'scope' if k == 'rho_scope' else k}"] = v
    # The Merge form takes the counting convention from here (the authors' presets count tied embeddings twice).
    state.tuned().update(values, preset=preset.name, rescale_factor=st.session_state.get("tune_rescale"),
                         count_tied_twice=bool(params.get("count_tied_twice", False)))


def _custom() -> None:
    """A control moved by hand: the setting is no longer the preset (nor its counting convention)."""
    st.session_state["tune_preset"] = presets.CUSTOM
    state.tuned().update(preset=presets.CUSTOM, count_tied_twice=False)


def preset_row() -> None:
    """Start from a named setting: the paper's RAM+, the RAM authors' script's two modes, mergekit's defaults."""
    if "tune_preset" not in st.session_state:
        st.session_state["tune_preset"] = state.tuned().get("preset", presets.CUSTOM)
    presets.picker("tune_preset", "tune_rescale", _apply_preset, "custom (the controls below)",
                   "Sets r, α, the rule and the ρ scope; ε stays. Moving a control makes it custom.",
                   label="Start from a preset")


def describe(p: dict) -> str:
    alpha = "" if p["rule"] == "soft" else f", α {p['alpha']:g}"
    return f"ε {charts.eps_label(p['eps'])}, r {p['r']:g}{alpha}, {p['rule']}, {p['rho_scope']} ρ"


MERGE_TA_KEY = TA_LAMBDA_KEY  # the λ last set for task arithmetic on the Merge form (app/views/merge.py)


def ta_lambda() -> float:
    """The task-arithmetic λ the survival chart uses: a slider that starts at the Merge form's λ (or the method's
    default, 1.0) — task arithmetic keeps λ of every unique update, so 1/N would make it averaging."""
    from merging.methods import get_method

    default = float(st.session_state.get(MERGE_TA_KEY, next(p.default for p in get_method("task_arithmetic").params
                                                              if p.name == "lambda")))
    if "tune_ta_lambda" not in st.session_state:
        st.session_state["tune_ta_lambda"] = min(2.0, max(0.0, default))
    return float(st.slider("task arithmetic λ (for the chart below)", 0.0, 2.0, step=0.05, key="tune_ta_lambda",
                           help="Task arithmetic adds λ·Σ τ_t: it keeps λ of every unique update. Starts at the λ "
                                "on the Merge form (the demo's validation-tuned task arithmetic uses λ = 1.0)."))


def retention_caption(ta: float, n: int) -> str:
    """What the survival chart shows, with the task-arithmetic λ it uses and where that λ comes from."""
    merge_ta = st.session_state.get(MERGE_TA_KEY)
    source = (f"the Merge form's λ ({float(merge_ta):g})" if merge_ta is not None and float(merge_ta) == ta
              else "the slider above")
    return (f"Averaging keeps 1/N = 1/{n} of a unique update; task arithmetic keeps λ = {ta:g} of it ({source}; "
            f"λ = 1/{n} would be averaging); RAM keeps all of it, RAM+ λ_t. Only the unique part is shown: task "
            "arithmetic with λ > 1/N also adds up the agents' shared updates instead of averaging them.")


MEASURE_JOB = "tune_measure_job"


def setting_candidate(p: dict):
    """The merge a Tune setting stands for: RAM+ (clip rule) or RAM+s (soft rule) with its ε, r, α and ρ scope."""
    from evaluation.grid import candidate

    params = {"eps": p["eps"], "r": p["r"]} | ({} if p["rule"] == "soft" else {"alpha": p["alpha"]})
    return candidate("ram_plus_soft" if p["rule"] == "soft" else "ram_plus", params | {"rho_scope": p["rho_scope"]})


def run_measure(sel: state.Selection, cands: list, job: jobs.Job) -> list:
    """Worker: merge A and B in memory and score both on the demo's validation split
    (demo.evaluator.measure_on_demo), its progress on the job."""
    from demo.evaluator import measure_on_demo

    def progress(p) -> None:
        job.report(p.fraction, p.current or ("opening the models" if p.phase == "open" else
                                             f"{p.done} of {p.total} scored"))

    return measure_on_demo(sel.base, list(sel.agents), cands, "validation", progress=progress, cancel=job.cancel)


def measure_panel(job: jobs.Job) -> None:
    st.progress(min(1.0, job.fraction), text=f"Scoring A and B: {job.text or 'starting'} · "
                                             f"{format_seconds(job.elapsed)}")


def measured(a: dict, b: dict) -> None:
    """On the demo: the two settings' scores, measured (merged in memory, scored on the validation split)."""
    cands = [setting_candidate(a), setting_candidate(b)]
    mgr = jobs.manager()
    task = mgr.get(st.session_state.get(MEASURE_JOB))
    running = task is not None and task.running
    row = st.container(horizontal=True, vertical_alignment="center")
    if row.button("Score A and B on the demo tasks", icon=":material/science:", key="tune_measure", disabled=running,
                  help="Merges both settings in memory (no folder written) and scores them on the validation split; "
                       "scores are kept, so a setting scored before comes back at once."):
        try:
            task = mgr.submit("measure", jobs.session_id(), "scoring settings A and B",
                              lambda j, s=sel, c=cands: run_measure(s, c, j))
        except RamStudioError as exc:
            state.show_error(exc, "Scoring A and B")
        else:
            st.session_state[MEASURE_JOB] = task.id
            running = True
    row.caption("Measured accuracy, not just λ_t: the demo's validation split, both settings merged in memory.")
    if running:
        jobs.poll(task, measure_panel)
        return
    if task is None or not jobs.ending(task, "Scoring A and B") or not task.result:
        return
    got = {e.candidate: e for e in task.result}
    if any(c not in got for c in cands):
        st.caption("The scores below are for earlier settings: score again to measure these. "
                   + " · ".join(f"{tag}: {printable(e.label)}" for tag, e in zip("AB", task.result)))
    ea, eb = task.result[0], task.result[1]
    measured_table(ea, eb)
    st.caption(f"Accuracy (%) ± one standard error on the validation split "
               f"({', '.join(f'{k}: {n}' for k, n in ea.n.items())} examples). "
               f"A: {printable(ea.label)} — merged in {ea.merge_s:.2f} s, scored in {ea.eval_s:.1f} s"
               f"{' (stored)' if ea.resumed else ''}. B: {printable(eb.label)} — merged in {eb.merge_s:.2f} s, scored "
               f"in {eb.eval_s:.1f} s{' (stored)' if eb.resumed else ''}. Whole job: {format_seconds(task.elapsed)}.")


def measured_table(ea, eb) -> None:
    """A's and B's scores ± standard error per task and on average, and B − A paired per example (both were scored
    on the same examples) with a verdict that claims a difference only beyond two standard errors."""
    from analysis.noise import Z, beyond_noise, plus_minus
    from evaluation.verdicts import difference

    d = difference(eb, ea)
    names = [*ea.scores, "average"]
    rows = {"A": [plus_minus(ea.scores[t], ea.stderr.get(t), 2) for t in ea.scores]
            + [plus_minus(ea.average, ea.average_stderr, 2)],
            "B": [plus_minus(eb.scores.get(t), eb.stderr.get(t), 2) for t in ea.scores]
            + [plus_minus(eb.average, eb.average_stderr, 2)]}
    per = [d["tasks"].get(t, {"diff": float("nan"), "stderr": None}) for t in ea.scores] + [d]
    rows["B − A"] = [plus_minus(x["diff"], x["stderr"], 2, signed=True) for x in per]
    rows["verdict"] = [("B higher" if x["diff"] > 0 else "A higher") if beyond_noise(x["diff"], x["stderr"])
                       else "within noise" for x in per]
    st.table(pd.DataFrame(rows, index=names))
    st.caption(f"B − A is paired per example{'' if d['paired'] else ' (unpaired: per-example outcomes missing)'}: "
               f"a difference counts only beyond {Z:g} standard errors; within that, these scores cannot tell A "
               "from B.")
    bars = pd.DataFrame({"task": names, "A": [*ea.scores.values(), ea.average],
                         "A_se": [*(ea.stderr.get(t) for t in ea.scores), ea.average_stderr],
                         "B": [*(eb.scores.get(t) for t in ea.scores), eb.average],
                         "B_se": [*(eb.stderr.get(t) for t in ea.scores), eb.average_stderr]})
    charts.show(charts.measured_bars(bars, res.agents), bars,
                "Validation accuracy of A and B (hatched) ± one standard error per task and on average.",
                "measured_a_b", title="Settings A and B, measured")


@st.fragment
def compare(a: dict) -> None:
    """A | B (its own fragment inside the tuner: moving a B control redraws only this part)."""
    t0 = time.perf_counter()
    ladder = list(res.ladder)
    agents = res.agents
    st.subheader("Compare two settings: A | B")
    st.caption(f"**A** is the setting above ({describe(a)}). Choose **B** to see what changes: λ_t, and the "
               "unique update a RAM+ merge keeps, λ_t·‖τ_unique‖ (a different ε also changes which elements are "
               "unique).")
    b_start = {**a, "eps": 1e-3 if 1e-3 in ladder else ladder[-1]}
    with st.container(border=True):
        b = setting_widgets("tune_b", b_start, ladder, st.columns([2.4, 2, 2, 1.9, 2.1]))
    with state.guard("Comparing A and B"):
        cmp = tables.compare_settings(res, a, b)
        st.table(frames.compare_frame(cmp))
        charts.show(charts.compare_bars(cmp, agents), cmp,
                    f"A: {describe(a)}. B (hatched): {describe(b)}. 'kept' is the L2 norm of the unique update after "
                    "scaling by λ_t, in weight units.", "compare_a_b", title="Setting A | setting B",
                    params={"A": describe(a), "B": describe(b), "agents": agents})
    st.caption(f"A | B recomputed in {1000 * (time.perf_counter() - t0):.0f} ms.")
    if sel is not None and sel.is_demo:
        measured(a, b)


@st.fragment
def tuner() -> None:
    t0 = time.perf_counter()
    p = state.tuned()
    ladder = list(res.ladder)
    preset_row()
    a = setting_widgets("tune", p, ladder, st.columns([2.4, 2, 2, 1.9, 2.1]), on_change=_custom)
    p.update(a)
    eps, r, alpha, rule, scope = a["eps"], a["r"], a["alpha"], a["rule"], a["rho_scope"]
    agents = res.agents
    params = {"eps": eps, **state.rule_params(a), "scope": scope, "agents": agents}
    with state.guard("Computing λ_t"):
        lam = tables.lambda_table(res, eps, r, alpha, rule, scope)
        # the λ table beside λ(ρ) when both fit (tensor scope's table has seven columns: never), else above it
        (left, right), shares = (charts.beside([2, 3], [300, charts.PAIR_PX]) if scope == "global" else
                                 ((st.container(), st.container()), [1.0, 1.0]))
        with left:
            st.subheader("λ_t per agent")
            st.table(frames.lambda_rows(lam))
            st.download_button("CSV", csv_later(lam),
                               f"{charts.export_name('lambda_table', params)}.csv", "text/csv",
                               key="csv_lambda_table", icon=":material/download:")
            st.caption("λ_t > 1 boosts an agent's unique update to make up for what averaging its shared "
                       "part costs it; the more it overlaps (higher ρ_t), the larger λ_t."
                       + (" Tensor scope: each tensor uses its own ρ; λ_t here is the mean over tensors, weighted "
                          "by unique elements, and the ρ column gives the per-tensor median and range (tensors "
                          "holding unique elements, weighted by them)." if scope == "tensor" else ""))
        with right:
            curve_df = lam[["agent", "shared", "unique", "rho", "lambda"]]
            wide = charts.wants_log_rho(lam["rho"], alpha)
            log = st.toggle("log ρ axis", value=wide, key=f"tune_log_rho_{wide}",
                            help="On when the agents' ρ_t span more than the curve's bend, so every agent is on the "
                                 "axis.")
            charts.show(charts.lambda_curve(lam, agents, r, alpha, rule, log), curve_df,
                        ("Each dot is an agent at its ρ_t (▶ = ∞, no unique element); past α the clip rule stops "
                         "growing, so heavy overlap cannot explode λ."
                         if rule == "clip" else
                         "Each dot is an agent at its ρ_t; the soft rule saturates towards 1 + r, gentler than "
                         "clipping."),
                        "lambda_curve", title="λ(ρ) with each agent's ρ_t", params=params, width=shares[1])
        ta = ta_lambda()
        ret = tables.signal_retention(res, eps, r, alpha, rule, scope, ta_lambda=ta)
        charts.show(charts.retention_bars(ret, agents), ret, retention_caption(ta, len(agents)), "signal_retention",
                    title="How much of each agent's unique update survives", params=params | {"TA λ": ta})

        compare(a)
    st.caption(f"Recomputed in {1000 * (time.perf_counter() - t0):.0f} ms from cached statistics "
               f"(no weights read).")


tuner()
st.page_link("views/merge.py", label="Merge with setting A", icon=":material/arrow_forward:")

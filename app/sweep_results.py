"""The Sweep page's results: what was chosen, the candidate to take to the Merge page, the charts and every
score with its downloads (the page runs the sweep; evaluation.sweep computes it)."""
from __future__ import annotations

import json
import math
from functools import partial

import pandas as pd
import streamlit as st

from app import charts, state
from app.tables import show_table
from evaluation.report import csv_bytes, result_frame, result_json
from evaluation.sweep import SweepResult
from merging.common.errors import printable
from merging.common.units import format_seconds


def sweep_csv(res: SweepResult) -> bytes:
    """Every score of the sweep as CSV (made when its download is clicked)."""
    return csv_bytes(result_frame(res))


def entries_frame(entries) -> pd.DataFrame:
    """Entries as a display table: model/candidate, split, each task, average and its standard error, seconds,
    chosen, and whether a validation score is within noise of the best (≈)."""
    tasks = list(dict.fromkeys(k for e in entries for k in e.scores))
    rows = []
    for e in entries:
        row = {"candidate": e.label, "split": e.split, **{t: e.scores.get(t) for t in tasks},
               "average": None if math.isnan(e.average) else e.average, "± s.e.": e.average_stderr,
               "merge s": e.merge_s, **({"Fisher s": e.fisher_s} if any(x.fisher_s for x in entries) else {}),
               "eval s": e.eval_s, "chosen": "★ best" if e.best else ("✓" if e.selected else ""),
               "≈ best": "≈" if e.within_noise and not e.best else "",
               "note": e.error or ("stored" if e.resumed else "")}
        rows.append(row)
    return pd.DataFrame(rows)


def _pm(value: float | None, se: float | None) -> str:
    from analysis.noise import plus_minus

    return plus_minus(value, se, 2)


def noise_panel(res: SweepResult) -> None:
    """What the sweep's noise allows: grid edges (warnings, with the next values), coin tosses, and the chosen
    candidates against each other on the report split (paired per example)."""
    from evaluation.verdicts import edge_note

    edges = [e for e in res.candidates(res.spec.select_on) if e.selected and e.grid_edge]
    shown = {edge_note(e, e.grid_edge) for e in edges}
    for e in edges:
        st.warning(printable(edge_note(e, e.grid_edge)), icon=":material/border_outer:")
    for note in res.notes:
        if note not in shown:
            st.caption(printable(note))
    if not res.comparisons:
        return
    rows = pd.DataFrame([{"a": c["a"], "b": c["b"], "a − b": _pm(c["diff"], c["stderr"]),
                          "verdict": ("a beats b" if c["diff"] > 0 else "b beats a") if c["beyond_noise"]
                          else "within noise", "paired": "yes" if c["paired"] else "no"} for c in res.comparisons])
    with st.expander(f"The chosen candidates against each other on {res.spec.report_on} "
                     f"({sum(c['beyond_noise'] for c in res.comparisons)} of {len(res.comparisons)} differences "
                     "beyond noise)"):
        show_table(rows)
        st.caption("Difference of the task averages ± its standard error, paired per example (both were scored on "
                   "the same examples, so their shared hard examples cancel); a difference counts only beyond two "
                   "standard errors.")


def fill_merge_page(method: str, params: dict) -> None:
    """Put a candidate into the Merge page's form (its method and every parameter) and go there."""
    from app.forms import OUT_CUSTOM, fill_merge_form
    from merging.interop.mergekit_form import form_values

    fill_merge_form(method, form_values(method, params))
    st.session_state[OUT_CUSTOM] = None  # the output folder follows the settings
    st.switch_page("views/merge.py")


def export_picker(res: SweepResult) -> None:
    """Any scored candidate (the best first) → the Merge page."""
    cands = [e.candidate for e in res.candidates(res.spec.select_on) if e.ok]
    order = ([res.best] if res.best else []) + [c for c in cands if c != res.best]
    if not order:
        return
    c = st.columns([3, 1.3], vertical_alignment="bottom")
    tied = bool(ties(res))
    pick = c[0].selectbox("Candidate", order, key="sweep_export_pick", format_func=lambda x: x.label
                          + (f"  (best overall{', tied' if tied else ''})" if x == res.best else
                             "  (chosen)" if x in res.selected.values() else ""))
    if c[1].button("Merge & export this candidate", key="sweep_export", type="primary", icon=":material/merge:"):
        fill_merge_page(pick.method, pick.param_dict)


SCORES_KEY = "sweep_score_tables"  # selection key → (Table-1-like scores, paired comparisons, agents) of its last sweep


def session_evidence(sel: state.Selection) -> str:
    """For the overlap reading: a sentence citing this session's last finished sweep of these same models (their
    report split), or ""."""
    from analysis.regimes import evidence, read_table1

    got = st.session_state.get(SCORES_KEY, {}).get(sel.key)
    if got is None:
        return ""
    table, pairs, agents = got
    return evidence(read_table1(table, agents, pairs), "this session's sweep, test split, settings chosen on "
                                                       "validation")


def results(res: SweepResult, sel: state.Selection) -> None:
    """The finished sweep: what was chosen, the export picker, the charts and every score with downloads."""
    from evaluation.report import score_table

    st.session_state.setdefault(SCORES_KEY, {})[sel.key] = (*score_table(res), res.context["labels"][1:])
    spec = res.spec
    valid, test = res.candidates(spec.select_on), res.candidates(spec.report_on)
    stored = sum(e.resumed for e in res.entries)
    st.success(f"{len(valid)} candidates scored on {spec.select_on}, the {len(test)} chosen on {spec.report_on}, in "
               f"{format_seconds(res.seconds)}" + (f" ({stored} scores reused from earlier runs)" if stored else "")
               + (f". Best overall (by {spec.select_on} average): **{printable(res.best.label)}**."
                  if res.best else "."),
               icon=":material/check_circle:")
    tie_note(res)
    chosen = pd.DataFrame([chosen_row(res, m, c) for m, c in res.selected.items()])
    if not chosen.empty:
        show_table(chosen)
        st.caption("Averages ± one standard error (√(Σ se²)/k over the tasks). ≈: within noise of the best overall "
                   f"on {spec.select_on} — its paired difference from the best is under two standard errors.")
    noise_panel(res)
    export_picker(res)

    st.subheader("Charts")
    bars, lines, times = st.tabs(["Chosen vs agents", "Score vs parameter (Table 2 view)",
                                  "Score vs merge time (Fig. 9 view)"])
    with bars:
        chosen_chart(res)
    with lines:
        parameter_chart(res)
    with times:
        time_chart(res)
    every_score(res)


def ties(res: SweepResult) -> list:
    """The selection-split entries whose average equals the best overall's as the tables show it (2 decimals):
    a tie the best-overall star alone would hide."""
    valid = [e for e in res.candidates(res.spec.select_on) if e.ok]
    best = next((e for e in valid if e.best), None)
    return [] if best is None else [e for e in valid if not e.best and round(e.average, 2) == round(best.average, 2)]


def tie_note(res: SweepResult) -> None:
    """Say when the best overall is tied on the selection split (and how many more are within noise of it): the
    star then marks the first in the grids' order, not a better candidate."""
    tied = ties(res)
    if not tied:
        return
    spec = res.spec
    best = next(e for e in res.candidates(spec.select_on) if e.best)
    close = [e for e in res.candidates(spec.select_on) if e.ok and e.within_noise and not e.best and e not in tied]
    names = ", ".join(f"**{printable(e.label)}**" for e in tied)
    st.warning(f"Tie on {spec.select_on}: **{printable(best.label)}** and {names} average {best.average:.2f} % each; "
               "★ best overall marks the first of them in the grids' order, not a better one."
               + (f" {len(close)} other candidate{'s are' if len(close) != 1 else ' is'} within noise of it "
                  "(paired difference under two standard errors)." if close else ""),
               icon=":material/balance:")


def chosen_row(res: SweepResult, method: str, c) -> dict:
    """One method's chosen candidate: its setting, both averages ± s.e., within noise of the best, grid edge."""
    spec = res.spec
    v = next(e for e in res.candidates(spec.select_on) if e.candidate == c)
    t = next((e for e in res.candidates(spec.report_on) if e.candidate == c), None)
    return {"method": method, "chosen setting": c.settings or "(no parameters)",
            f"{spec.select_on} average": _pm(v.average, v.average_stderr) + (
                "  ★ (tie)" if v.best and ties(res) else "  = (tie)" if v in ties(res) else
                "  ≈" if v.within_noise and not v.best else "  ★" if v.best else ""),
            f"{spec.report_on} average": _pm(t.average, t.average_stderr) if t is not None else "–",
            "grid edge": ", ".join(v.grid_edge)}


def _tasks_agents(res: SweepResult) -> tuple[list[str], list[str]]:
    """The tasks scored and the agents' labels."""
    return list(dict.fromkeys(k for e in res.entries for k in e.scores)), res.context["labels"][1:]


def chosen_chart(res: SweepResult) -> None:
    """Each method's chosen candidate next to the base and the agents, on the report split."""
    spec = res.spec
    tasks, agents = _tasks_agents(res)
    test = res.candidates(spec.report_on)
    rows = [{"name": e.label, "short": charts.short_candidate(e.method, e.params, list(e.candidate.given)),
             **e.scores, "average": e.average, **_se_cols(e)} for e in test]
    refs = res.references()
    models = charts.short_labels([e.label for e in refs])  # the base and the agents: the agents' rule
    rows += [{"name": e.label, "short": models[e.label], **e.scores, "average": e.average, **_se_cols(e)}
             for e in refs]
    if rows:
        df = pd.DataFrame(rows)
        df["short"] = charts.short_candidate_labels(list(df["short"]), limit=20)
        charts.show(charts.sweep_task_bars(df, tasks, agents), df,
                    f"{spec.report_on.capitalize()} accuracy of each method's chosen candidate next to the base and "
                    "the agents, ± one standard error (hover for full names).", "sweep_chosen",
                    title="Chosen candidates and the agents",
                    params={"split": spec.report_on, "agents": agents})


def _se_cols(e) -> dict:
    """An entry's standard errors as `<task>_se` and `average_se` (what the charts draw as error bars)."""
    return {**{f"{t}_se": e.stderr.get(t) for t in e.scores}, "average_se": e.average_stderr}


def parameter_chart(res: SweepResult) -> None:
    """Score against one swept parameter of one method, the others fixed (at the chosen candidate's values)."""
    spec = res.spec
    tasks, agents = _tasks_agents(res)
    valid = res.candidates(spec.select_on)
    swept = [(m, k) for m in dict.fromkeys(e.method for e in valid)
             for k in dict.fromkeys(k for e in valid if e.method == m for k in e.candidate.given)
             if len({repr(e.params[k]) for e in valid if e.method == m}) > 1]
    if not swept:
        st.caption("No method was tried at more than one value of a parameter.")
        return
    c = st.columns([2, 3])
    method, param = c[0].selectbox("Method and parameter", swept, key="sweep_line_pick",
                                   format_func=lambda mk: f"{mk[0]}: {mk[1]}")
    part = [e for e in valid if e.method == method and e.ok]
    fixed = {}
    others = [k for k in dict.fromkeys(k for e in part for k in e.candidate.given) if k != param
              and len({repr(e.params[k]) for e in part}) > 1]
    best = next((e for e in valid if e.candidate == res.selected.get(method)), None)
    for k in others:
        values = list(dict.fromkeys(e.params[k] for e in part))
        start = values.index(best.params[k]) if best is not None and best.params[k] in values else 0
        fixed[k] = c[1].selectbox(f"at {k} =", values, index=start, key=f"sweep_fix_{method}_{k}")
    part = [e for e in part if all(e.params[k] == v for k, v in fixed.items())]
    df = pd.DataFrame([{"candidate": e.label, param: e.params[param], **e.scores, "average": e.average,
                        **_se_cols(e), "within_noise": bool(e.within_noise_method)} for e in part])
    charts.show(charts.sweep_param_lines(df, param, tasks, agents), df,
                f"{spec.select_on.capitalize()} accuracy per task as {param} varies"
                + (f" ({', '.join(f'{k} = {v}' for k, v in fixed.items())})" if fixed else "")
                + ", ± one standard error; ★ the best average; on the average line, filled markers are within noise "
                  f"of {method}'s chosen setting (paired difference under two standard errors), open ones are not.",
                "sweep_param", title=f"{method}: score against {param}",
                params={"split": spec.select_on, "method": method, **fixed})


def time_chart(res: SweepResult) -> None:
    """Each candidate's selection-split average against its merge's seconds."""
    spec = res.spec
    df = pd.DataFrame([{"candidate": e.label, "method": e.method, "merge_s": e.merge_s, "fisher_s": e.fisher_s,
                        "average": e.average, "average_se": e.average_stderr, "selected": e.selected}
                       for e in res.candidates(spec.select_on) if e.ok])
    if not df.empty:
        charts.show(charts.sweep_time_scatter(df), df,
                    f"Each candidate's {spec.select_on} average ± one standard error against the seconds its "
                    "in-memory merge took, a Fisher merge's with the Fisher pass behind it (all agents, to its N; "
                    "computed once and cached) (★ chosen).", "sweep_time", title="Score against merge time",
                    params={"split": spec.select_on})


def every_score(res: SweepResult) -> None:
    """Every entry as a table, and the sweep as JSON and CSV downloads."""
    st.subheader("Every score")
    every = entries_frame(res.entries)
    show_table(every.style.format(precision=2, subset=[c for c in every.columns if c not in
                                                        ("candidate", "split", "chosen", "≈ best", "note")]),
               key="sweep_all")
    c = st.columns(2)
    c[0].download_button("JSON", (json.dumps(result_json(res, "local"), indent=2) + "\n").encode(), "sweep.json",
                         "application/json", key="sweep_dl_json", icon=":material/download:", width="stretch")
    c[1].download_button("CSV", partial(sweep_csv, res), "sweep.csv", "text/csv", key="sweep_dl_csv",
                         icon=":material/download:", width="stretch")

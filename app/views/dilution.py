"""Signal dilution: a toy you can play with (with its ρ_t and λ_t), then the demo's measured evidence: mini
Table 1, the paper's Fig. 3 experiment (from the demo's results, or run now on the selected models), and the
RL reward curves."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from analysis import tables
from analysis.fig3 import own_task
from analysis.toy import COLS, ROWS, TOY_EPS, toy_merges, toy_rho_lambda, toy_taus, unique_retention
from app import charts, jobs, state
from app.markup import md
from app.tables import show_table
from demo.tasks import TASKS
from merging.common.errors import RamStudioError
from merging.common.units import format_seconds

if TYPE_CHECKING:
    from analysis.regimes import TableReading

FIG3_JOB = "fig3_task"


def demo_agent_labels() -> list[str]:
    """The demo agents' labels (their colours are fixed by name, the same as elsewhere in the app)."""
    demo = state.demo_selection()
    return [a.split(":", 1)[-1] for a in demo.agents] if demo else []


# ---------------------------------------------------------------- Fig. 3 on the selected models

def fig3_references(sel: state.Selection) -> "pd.DataFrame | None":
    """Base and full-agent rows from the demo's accuracy.csv when the selection is a demo trio (else they are
    scored in the job)."""
    from demo import fig3

    if not sel.is_demo:
        return None
    labels = fig3.labels_of(sel.agents)
    return fig3.reference_rows(state.demo_results(sel.demo_trio) / "accuracy.csv", labels, fig3.own_tasks(labels))


def run_fig3(sel: state.Selection, job: jobs.Job) -> pd.DataFrame:
    """Worker: the experiment (demo.fig3) on the selected models, each agent scored on its own task (test
    split), its progress and cancel on the job."""
    from demo import fig3

    tidy = fig3.run_experiment(sel.base, list(sel.agents), references=fig3_references(sel), step=job.report,
                               cancel=job.cancel)
    return fig3.percent_rows(tidy)


def fig3_duration(sel: state.Selection) -> str:
    """How long the experiment should take on the selected models, estimated from their size (headers only:
    nothing is read or downloaded); a sentence, or why there is no estimate."""
    from demo import fig3

    known = fig3_references(sel) is not None
    try:
        seconds, params = fig3.estimate(sel.base, list(sel.agents), known)
    except RamStudioError:
        return "no estimate until the models are readable here (Hub models must be downloaded first)"
    return (f"about {format_seconds(seconds)} here, estimated from the models' size ({state.fmt_count(params)} "
            f"parameters, {2 * len(sel.agents)} merges and their "
            f"scoring{'' if known else ', plus the base and agents'})")


def fig3_panel(job: jobs.Job) -> None:
    """Progress of the running experiment (drawn by jobs.poll every second)."""
    st.progress(job.fraction, text=f"Fig. 3 experiment: {md(job.text or 'starting')} · {format_seconds(job.elapsed)}")


CANCEL_FIG3 = jobs.CancelButton("Cancel", "fig3_cancel",
                                caption="You can switch pages; the experiment keeps going in the background.")


def fig3_chart(tidy: pd.DataFrame, agents: list[str], source: str, name: str) -> None:
    view = own_task(tidy, agents)
    if view.empty:
        show_table(tidy)
        st.caption(f"{md(source)}: no agent is named after one of the tasks, so all rows are listed.")
        return
    charts.show(charts.fig3_bars(view, agents), tidy,
                "Only the agent's unique region is added to the base (± one standard error). Whole (solid) it carries "
                "part of the skill; divided by N (hatched), as averaging does, that part shrinks — the paper's signal "
                "dilution. Grey: the base; faint: the full agent. " + md(source) + ".", name,
                title="Fig. 3 on the demo: unique region only, whole and ÷ N",
                params={"agents": agents, "split": "test"})


# ---------------------------------------------------------------- two trios, two regimes

REGIME_EPS = 1e-5


def trio_evidence(prefix: str, share: float = 0.5) -> tuple[str, TableReading] | None:
    """One demo trio's Table 1, its shared-region diagnostics next to chance, and the readings of both (drawn
    into the current column); None when the trio or its results are not here."""
    from analysis import agreement, regimes

    st.markdown(f"**`{prefix}`** · {state.DEMO_TRIOS[prefix][1]}")
    sel = state.demo_selection(prefix)
    table, source = state.demo_accuracy(prefix)
    if sel is None or table is None:
        st.caption(f"Not here yet: `{prefix}` needs its models and its results ({md(source or 'table1.csv')}), "
                   "built by `python -m demo.build" + ("" if prefix == "demo:" else " --suite shared") + "`.")
        return None
    from demo.evaluate import with_stderr

    agents = [a.split(":", 1)[-1] for a in sel.agents]
    shown = with_stderr(table.drop(columns=[c for c in table.columns if "@" in str(c)]))
    show_table(shown, index=True, key=f"regime_table_{prefix}", height=36 * (len(shown) + 1) + 2,
               width_share=share)
    st.caption(f"Test split, accuracy % ± one standard error ({md(source)}; each method's settings chosen on "
               "validation; binomial per task, √(Σ se²)/3 for the average).")
    res = state.run_analysis(sel)
    if res is None:
        return None
    pairs = agreement.pair_agreement(res, REGIME_EPS)
    show_table(pd.DataFrame({
        "pair": [f"{r.a}–{r.b}" for r in pairs.itertuples()],
        "both changed": pairs["both_changed"].map(state.fmt_count),
        "same sign": [f"{charts.pct(v)} ± {100 * agreement.sign_se(int(n), v):.1f}"
                      for v, n in zip(pairs["sign_agreement"], pairs["both_changed"])],
        "chance": pairs["chance_sign_agreement"].map(charts.pct),
        "cosine": pairs["cosine"].map("{:+.3f}".format), "chance ": pairs["chance_cosine"].map("{:+.0f}".format)}),
        key=f"regime_pairs_{prefix}", width_share=share)
    ag = agreement.agent_agreement(res, REGIME_EPS)
    rho = tables.rho_table(res, REGIME_EPS).set_index("agent")["rho"]
    show_table(pd.DataFrame({
        "agent": ag["agent"], "density": (ag["changed"] / res.total_params).map(charts.pct),
        "unique share": ag["unique_share"].map(charts.pct),
        "chance (model / tensor)": [f"{charts.pct(a)} / {charts.pct(b)}" for a, b in
                                    zip(ag["chance_unique_share"], ag["chance_unique_share_tensor"])],
        "ρ_t": ag["agent"].map(rho).map(lambda v: "∞" if not math.isfinite(v) else f"{v:.2f}"),
        "shared Σ τ²": ag["shared_energy_share"].map(charts.pct),
        "dominated": ag["dominated_30_share"].map(charts.pct)}),
        key=f"regime_agents_{prefix}", width_share=share)
    read = regimes.read_table1(table, agents, state.demo_comparisons(prefix))
    diag = agreement.reading(res, REGIME_EPS, regimes.evidence(read, f"Table 1 of `{prefix}`, test split"))
    st.caption("Per agent: share of its update energy Σ τ² in shared elements, and of that the share where the "
               "other agents together moved less than 30 % as much (what averaging divides though the partners "
               "barely moved).")
    st.markdown(md(diag.text))
    st.markdown(md(read.text))
    from demo.table1_step_rule import NAME
    from demo.table1_step_rule import reading as step_rule_reading

    step = step_rule_reading(state.demo_results(prefix))
    if step:
        st.caption(md(f"With ε in representable steps of bf16 in RAM / RAM+'s grid (our extension; {NAME}.csv): "
                      + step))
    return diag.regime, read


def two_regimes() -> None:
    """Both demo trios side by side: coincidental overlap (`demo:`) and a shared skill (`demo-shared:`)."""
    from analysis import regimes

    st.header("Two demos, two regimes")
    st.markdown(f"The bundled demo's agents share no skill: where two of them changed the same weight, their updates "
                "are unrelated. The second demo trio (`demo-shared:`) was trained so that every agent must also learn "
                f"one common habit. Same tasks, same merges; the diagnostics (ε = {REGIME_EPS:g}, elements both "
                "agents changed) say whether the overlap is real, Table 1 what each merge keeps.")
    cols, share = charts.pair()  # side by side when both fit, else one under the other
    readings = {}
    for col, prefix in zip(cols, state.DEMO_TRIOS):
        with col, state.guard(f"The {prefix} trio"):
            got = trio_evidence(prefix, share)
            if got is not None:
                readings[f"`{prefix}`"] = got
    text = regimes.contrast(readings)
    if text:
        st.markdown("**Reading across the two trios.** " + text)


# ---------------------------------------------------------------- page

st.title("Signal dilution")
st.markdown(
    "A task vector τ_t = θ_t − θ_0 is what RL fine-tuning changed. RL changes **few** weights, and "
    "**different** agents change **different** ones. Averaging N task vectors divides every element by N — "
    "fine where agents agree, but where only one agent changed a weight its update simply shrinks to 1/N: the "
    "**signal dilution** of the paper (Sec. 3.2). **RAM** averages only where agents overlap and keeps unique "
    "updates whole; **RAM+** also boosts unique updates by λ_t to compensate for what averaging cost the agent.")

p = state.tuned()
c = st.columns([1, 5])
n = c[0].slider("Agents N", 2, 5, 3, key="toy_n")
seed = c[0].number_input("Seed", 0, 999, 0, key="toy_seed")
defaults = [(0.08, 0.6), (0.35, 0.4), (0.5, 0.3), (0.2, 0.5), (0.15, 0.2)]
names = [f"A{i + 1}" for i in range(n)]
toy_colors = charts.toy_colors(names)
dcols = c[1].columns(max(n, 3))
densities, overlaps = [], []
for i, nm in enumerate(names):
    with dcols[i].container(border=True):
        st.html(f"<span style='display:inline-block;width:10px;height:10px;border-radius:50%;"
                f"background:{toy_colors[nm]};margin-right:6px'></span><b>{nm}</b> (toy agent)")
        densities.append(st.slider(f"{nm} density", 0.02, 0.6, defaults[i][0], 0.01, key=f"toy_d{i}",
                                   help="Share of the toy parameters this agent changed."))
        overlaps.append(st.slider(f"{nm} overlap", 0.0, 1.0, defaults[i][1], 0.05, key=f"toy_o{i}",
                                  help="Share of its changes inside the region other agents change too."))

with state.guard("The toy example"):
    taus = toy_taus(densities, overlaps, int(seed))
    merged = toy_merges(taus, p["r"], p["alpha"])
    zmax = float(taus.abs().max()) or 1.0
    panels = [(f"τ of {nm}", taus[i].view(ROWS, COLS).numpy()) for i, nm in enumerate(names)]
    cols = max(n, len(merged))
    panels += [(None, None)] * (cols - n)  # merged results start on their own row
    panels += [(f"merged: {m}", tm.view(ROWS, COLS).numpy()) for m, tm in merged.items()]
    colors = [toy_colors[nm] for nm in names] + [None] * (len(panels) - n)
    grid = pd.DataFrame([{"panel": t, "row": r, "col": cc, "value": float(g[r][cc])}
                         for t, g in panels if t for r in range(ROWS) for cc in range(COLS)])
    toy_params = {"N": n, "seed": int(seed), "r": p["r"], "alpha": p["alpha"]}
    charts.show(charts.toy_heatmaps(panels, zmax, colors, cols), grid,
                "Pale cells under 'average' are unique updates shrunk to 1/N; RAM keeps their full colour.",
                "toy_heatmaps", title="Toy task vectors and their merges", params=toy_params)
    st.subheader("The toy's ρ_t and λ_t")
    rl = toy_rho_lambda(taus, names, p["r"], p["alpha"])
    st.table(pd.DataFrame({
        "agent": rl["agent"], "changed": rl["changed"], "shared": rl["shared"], "unique": rl["unique"],
        "unique share": rl["unique_share"].map(charts.pct), "chance": rl["chance_unique_share"].map(charts.pct),
        "ρ_t": rl["rho"].map(lambda v: "∞" if not math.isfinite(v) else f"{v:.3g}"),
        "λ_t": rl["lambda"].map("{:.3f}".format)}).set_index("agent"))
    st.caption(f"Counted on the toy (|τ| > {TOY_EPS:g}): ρ_t = shared / unique, λ_t = 1 + r·clip(ρ_t, 0, α) with "
               f"Tune's r = {p['r']:g}, α = {p['alpha']:g} — what RAM+ multiplies each toy agent's unique cells "
               "by. Chance: the unique share independent masks of the same densities would give.")
    ret = unique_retention(taus, merged, names)
    charts.show(charts.retention_bars(ret, names, toy_colors), ret,
                f"On each agent's unique cells, averaging keeps 1/{n} of the update; RAM keeps 100%, RAM+ λ_t "
                "(the table's last column).", "toy_retention", title="What each merge keeps of the unique cells",
                params=toy_params)

st.divider()
st.header("Measured on the demo")
st.markdown("The bundled demo trains three tiny RL agents (code, tool, memory) from one base, merges them, and "
            "scores every model on the three tasks.")
results = state.demo_results()
table1, log, acc = results / "table1.csv", results / "training_log.csv", results / "accuracy.csv"
if not table1.exists() and not log.exists():
    st.info("The demo's results are not here yet (`assets/demo/results/table1.csv`, `training_log.csv`). They are "
            "produced by `python -m demo.build`; this section fills in once they exist.",
            icon=":material/hourglass_empty:")
if table1.exists():
    with state.guard("Reading table1.csv"):
        from demo.table1 import caption as table1_caption

        t = pd.read_csv(table1)
        first = t.columns[0]
        metrics = [col for col in (*TASKS, "avg") if col in t.columns] or [
            col for col in t.columns[1:] if pd.api.types.is_numeric_dtype(t[col]) and "@" not in str(col)
            and not str(col).endswith("_se")][:6]
        charts.show(charts.table1_bars(t, first, metrics, demo_agent_labels()), t,
                    table1_caption(t, first, demo_agent_labels(), state.demo_comparisons()),
                    "table1", title="Accuracy per model (mini Table 1)", params={"split": "test"})
elif acc.exists():
    with state.guard("Reading accuracy.csv"):
        wide = state.demo_accuracy()[0].reset_index(names="model")
        tasks = [t for t in (*TASKS, "avg") if t in wide.columns]
        charts.show(charts.table1_bars(wide, "model", tasks, demo_agent_labels()), wide,
                    "Each agent should beat the base on its own task; the merges join this chart once "
                    "table1.csv exists.", "accuracy", title="Accuracy of the base and the agents",
                    params={"split": "test"})

st.subheader("Is the skill in the unique region? (paper Fig. 3)")
st.markdown("Keep **only** one agent's unique region — the elements no other agent changed — on top of the base, "
            "once whole and once divided by N as averaging would. If the whole region lifts the agent's own task and "
            "the divided one loses most of that, averaging's 1/N is what costs the skill.")
with state.guard("Reading fig3.csv"):
    tidy, source = state.demo_fig3()
    if tidy is None:
        st.info(f"The demo's measured Fig. 3 experiment is not available: {md(source)}. It is produced with the demo "
                "(`assets/demo/results/fig3.csv`); meanwhile you can run it on the selected models below.",
                icon=":material/hourglass_empty:")
    else:
        fig3_chart(tidy, demo_agent_labels() or sorted(set(tidy["agent"]) - {""}), f"From the demo build ({source})",
                   "fig3")

sel = state.selection()
mgr = jobs.manager()
task = jobs.follow(FIG3_JOB, "fig3")
running = task is not None and task.running
with st.container(border=True):
    if sel is None:
        st.caption("Select models on **Models** to run the experiment on them.")
    else:
        n_merges = 2 * len(sel.agents)
        st.markdown(f"**Run it on the selected models** ({len(sel.agents)} agents: {n_merges} `unique_only` merges "
                    "into a temporary folder, each scored with the demo evaluator on the agent's own task, then "
                    "deleted). Needs models built from the demo base (the evaluator uses its tokenizer and tasks); "
                    f"{md(fig3_duration(sel))}.")
        if st.button("Run the Fig. 3 experiment", icon=":material/science:", key="fig3_run", disabled=running):
            try:
                task = mgr.submit("fig3", jobs.session_id(), "the Fig. 3 experiment",
                                  lambda j, s=sel: run_fig3(s, j), merges=True)
            except RamStudioError as exc:
                state.show_error(exc, "Starting the experiment")
            else:
                jobs.remember(FIG3_JOB, "fig3", task.id)
                st.rerun()
        if running:
            jobs.poll(task, fig3_panel, cancel=CANCEL_FIG3)
        elif task is not None and jobs.ending(task, "The Fig. 3 experiment") and task.result is not None:
            from demo.fig3 import labels_of

            fig3_chart(task.result, labels_of(sel.agents), f"Run in this session in {format_seconds(task.elapsed)}",
                       "fig3_run")

if log.exists():
    with state.guard("Reading training_log.csv"):
        lg = pd.read_csv(log)
        if "stage" in lg.columns and (lg["stage"] == "rl").any():
            lg = lg[lg["stage"] == "rl"]
        ycol = next((col for col in lg.columns if "reward" in col), None)
        group = "agent" if "agent" in lg.columns else ("task" if "task" in lg.columns else None)
        if ycol is None or group is None or "step" not in lg.columns:
            st.subheader("RL training log")
            show_table(lg)
        else:
            agents = demo_agent_labels() or sorted(lg[group].astype(str).unique())
            charts.show(charts.reward_curves(lg, agents, "step", ycol, group), lg,
                        "Solid = moving average: each agent's reward should climb on its own task — the skill "
                        "its task vector carries.",
                        "reward_curves", title="RL reward during training", params={"agents": agents})

st.divider()
two_regimes()

"""Heterogeneity: how sparse and how disjoint the agents' task vectors are (paper Sec. 3, Fig. 2), ρ_t and λ_t
where they come from (per layer, module and tensor), norms, sign conflicts, and every unique share next to
what chance would give."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis import agreement, experts, paper, tables
from app import charts, frames, state
from app.tables import csv_later, show_table

st.title("Heterogeneity")
st.markdown("RL fine-tuning often changes only part of the parameters, and agents differ in how many and which. "
            "One streaming pass over the weights counts, for every ε, which elements each agent changed "
            "(|τ| > ε) and how many other agents changed them too. Every unique share is shown next to its "
            "**chance level**: the share independent random masks of the same densities would leave unique, "
            "Π_{j≠i}(1 − d_j) — above it, the agents' updates avoid each other; at it, the overlap is what "
            "density alone explains; below it, agents concentrate on the same weights.")

sel = state.selection()
res = state.analysis_or_stop(sel)
agents = res.agents


def pair():
    """Two places for a pair of charts and the share of the width each gets: side by side when both are wide
    enough (for a few agents), else one under the other at the page's width (`charts.pair`)."""
    if len(agents) > charts.WRAP_UP_TO:  # many agents: each chart takes the page's width (readable ticks)
        return st.container(), st.container(), 1.0
    (left, right), share = charts.pair()
    return left, right, share


# The controls keep their own widths and wrap onto another line when the page is narrow (never cut labels).
top = st.container(horizontal=True, vertical_alignment="bottom", wrap=True)
eps = top.select_slider("ε: an element counts as changed when |τ| > ε", options=list(res.ladder),
                        value=state.DEFAULT_EPS if state.DEFAULT_EPS in res.ladder else res.ladder[0],
                        format_func=charts.eps_label, key="het_eps", width=320)
log_small = top.toggle("log scale for shares", key="het_log",
                       help="Draw unique shares (against chance, per layer) on a log axis: a 0.5 % share next to "
                            "a 40 % one stays readable. Off: a linear axis zoomed to the data.")
buttons = top.container(horizontal=True, horizontal_alignment="right", width="content")
buttons.download_button("All data", csv_later(res.frame), "analysis_statistics.csv", "text/csv",
                        key="csv_all_stats", icon=":material/download:",
                        help="Every statistic of the pass: one row per agent × tensor × ε (CSV).")
if len(agents) > 1:
    buttons.download_button("Pair data", csv_later(res.pairs), "analysis_pairs.csv", "text/csv",
                            key="csv_all_pairs", icon=":material/download:",
                            help="The shared-region sums per pair of agents × tensor × ε: elements both changed, "
                                 "same sign, Σ τ_a·τ_b, Σ τ_a², Σ τ_b² (CSV).")
if buttons.button("Re-run", icon=":material/refresh:", help="Forget the cached result and read the weights again.",
                  key="het_rerun"):
    state.forget_analysis(sel)
    st.rerun()
st.caption(f"{len(agents)} agents · {state.fmt_count(res.total_params)} parameters · "
           + ("statistics from the cache" if res.from_cache else f"analysed in {res.seconds:.1f} s"))

base_params = {"eps": eps, "agents": agents}

CHANCE_LEVELS = ("Chance levels of a unique share (what independent random masks of the same densities d_j would leave "
                 "unique, Π_{j≠i}(1 − d_j), summed over the agent's changed elements): **whole model** — one density "
                 "per agent over all weights; **per tensor** — each tensor's own densities; **per tensor × binade** — "
                 "within each tensor, each group of elements whose base weights share the stored dtype's exponent "
                 "(so one representable step, one rounding gate for a small update) with its own densities. The gap "
                 "from whole-model to per-tensor chance is tensor placement; from per-tensor to per-binade, the number "
                 "format; what remains below the per-binade chance is element-level attraction.")


def precision_panel(eps: float) -> None:
    """The number format's view next to ε: where ε sits against one step of the stored dtype, how many stored
    values changed at all, and how many changed elements moved by exactly one representable value."""
    pv = tables.precision_view(res, eps)
    below = float(pv["eps_below_step_share"].iloc[0])
    st.markdown(f"**ε and the stored number format.** At ε = {charts.eps_label(eps)}, ε is below one representable "
                f"step of the stored dtype for **{100 * below:.1f} %** of the weights: there, every change of a stored "
                "value passes ε, so \"changed\" means \"the stored value changed\". Part of the sparsity is "
                "rounding: an accumulated update smaller than half a step at its weight rounds back to the base's "
                "value when the weights are stored.")
    show_table(frames.precision_frame(pv, charts.short_labels(agents)))  # short names: a narrow table
    st.caption("Per agent: density at this ε; at ε = 0 = the share of weights whose stored value differs from "
               "the base's at all; one step = the share of its changed elements whose stored value is the base's "
               "neighbour in the stored dtype (adjacent representable values), and one-step Σ τ² their share of the "
               "changed elements' Σ τ². A step is the spacing of the stored dtype's values at the base weight (bf16: "
               "2^(⌊log2|w|⌋ − 7)). "
               "`ram-studio analyze --eps-steps K` counts an element as changed when |τ| exceeds K steps at its "
               "base weight, and RAM / RAM+ take the same rule as `eps_steps` (our extension, not the paper's).")


def score_evidence() -> str:
    """Scores of these same models for the reading: this session's last sweep of them, else (a demo trio) its
    committed mini Table 1; "" when there are none."""
    from app.sweep_results import session_evidence

    found = session_evidence(sel)
    if found or not sel.is_demo:
        return found
    from demo.table1 import evidence_for

    return evidence_for(sel.base, list(sel.agents))


def overlap_panel(eps: float, view) -> None:
    """Is the overlap real? Shared updates against chance: the pair matrix, where each agent's update energy
    lies, per-tensor chance, the reading, and where agreement concentrates."""
    st.subheader("Is the overlap real?")
    st.markdown("RAM averages an element several agents changed, on the premise that it holds **shared "
                "knowledge**. If the agents' updates there are unrelated, their signs agree half of the time and "
                "their cosine is 0, and averaging mostly divides the largest update by the number of agents. "
                "Measured on the elements both agents changed at this ε, next to those chance values.")
    pa = agreement.pair_agreement(res, eps)
    ag = agreement.agent_agreement(res, eps)
    read = agreement.reading(res, eps, score_evidence())
    box = st.success if read.regime == "shared" else (st.info if read.regime in ("single", "too_few") else st.warning)
    box(agreement.markdown_text(read.text), icon=":material/insights:")
    charts.show(charts.pair_matrix(pa, agents), pa,
                "Each cell: one pair of agents, on the elements both changed. Blue = more agreement than chance, "
                "red = less, pale = chance level; the hover gives the count, what independent masks would give and "
                "one standard error at chance.", "overlap_pair_matrix", title="Do shared updates agree?",
                params=base_params)
    charts.show(charts.energy_profile(ag, agents), ag,
                "Purple: unique elements, kept whole by RAM. Grey: shared elements where the partners moved at least "
                "30 % as much. Orange/red: shared elements the agent dominates — averaging divides its update there "
                "although the others barely moved.", "overlap_energy_profile",
                title="Where each agent's update energy lies", params=base_params)
    show_table(frames.agreement_frame(ag))
    st.caption("Per agent, on its shared elements: same sign with each partner (pooled, chance 50 %); every active "
               "agent with its sign (chance from how many agents share each element); cosine of its update with the "
               "others' combined update (chance 0); the share of its energy Σ τ² in shared elements, and of that "
               "the share where the partners' combined |τ| is below 10 % or 30 % of its own. Unique share against "
               "its three chance levels. " + CHANCE_LEVELS)
    c = st.columns([2, 3], vertical_alignment="bottom")
    by = c[0].segmented_control("Where does agreement concentrate?", ["layer", "module"], default="layer",
                                key="het_agree_by") or "layer"
    grouped = agreement.agreement_by(view, eps, by)
    many = len(agents) * (len(agents) - 1) // 2 > charts.PAIR_LINES_UP_TO
    charts.show(charts.agreement_by_group(grouped, agents, by), grouped,
                (f"Per agent and {by}: same sign and cosine with the other agents on the elements both changed, the "
                 "mean over its pairs weighted by those elements (blue: above chance, red: below). Small groups "
                 "swing: the CSV has every pair and its element count." if many else
                 f"Per pair of agents and {by}: same sign and cosine on the elements both changed (dotted: chance). "
                 "Small groups swing: the hover gives each point's element count."),
                f"overlap_agreement_by_{by}", title=f"Agreement per {by}{tower_words}",
                params={**base_params, "by": by, **tower_param})


def towers_panel(eps: float):
    """Density per tower, and the tower the per-layer and per-module views below show (they never mix a vision
    block with a language layer of the same number). (result restricted to that tower, tower or None)."""
    found = experts.towers(res)
    if len(found) < 2:
        return res, None
    st.subheader("Towers")
    td = experts.tower_density(res, eps)
    left, right, half = pair()
    with left:
        charts.show(charts.tower_bars(td, agents), td,
                    "Share of each tower's parameters each agent changed.", "density_per_tower",
                    title="Density per tower", params=base_params, width=half)
    with right:
        charts.show(charts.tower_bars(td, agents, "unique_share"), td,
                    "Share of each agent's changes in the tower that no other agent made; ◆: what independent random "
                    "masks of the same densities would leave unique.", "unique_share_per_tower",
                    title="Unique share per tower", params=base_params, width=half)
    tower = st.segmented_control("Tower shown by the per-layer and per-module views below", found,
                                 default=found[0], key="het_tower") or found[0]
    return experts.for_tower(res, tower), tower


def experts_panel(eps: float) -> None:
    """The mixture-of-experts block: which routed experts each agent changed, density per layer × expert
    (with the shared expert and the router), and who changed each expert."""
    st.subheader("Mixture of experts")
    st.markdown("Routing sends each token to a few experts, so an RL update reaches only the experts the agent's "
                "tasks used: the others keep the base's weights exactly. Which experts each agent changed decides "
                "where the agents' updates can overlap at all.")
    owners = experts.expert_owners(res, eps)
    if set(owners["expert"].astype(str)) <= {"fused"}:
        st.info("The base stores its experts **fused** (one tensor per layer and projection stacks every expert), so "
                "the statistics are per fused tensor: density per layer below, but not which experts each agent "
                "changed. For per-expert views, analyse with a base saved one tensor per expert (`save_pretrained` "
                "writes that layout); agents in either layout are read in the base's.", icon=":material/info:")
    summary = experts.expert_summary(res, eps)
    shown = pd.DataFrame({
        "agent": summary["agent"],
        "routed experts changed": [f"{c:,} of {t:,}" for c, t in zip(summary["experts_changed"], summary["experts"])],
        "changed by this agent only": summary["experts_only_this_agent"].map("{:,}".format),
        "density in routed experts": summary["density_routed"].map(charts.pct),
        "shared expert": summary["density_shared"].map(lambda v: "–" if v != v else charts.pct(v)),
        "router": summary["density_router"].map(lambda v: "–" if v != v else charts.pct(v))})
    if set(owners["expert"].astype(str)) <= {"fused"}:  # no expert to count: the densities only
        shown = shown.drop(columns=["routed experts changed", "changed by this agent only"])
    show_table(shown)
    st.caption("Routed experts are counted per layer (layer × expert); an expert counts as changed when any of its "
               "elements moved by more than ε. Densities pool each expert's gate, up and down projections.")
    ed = experts.expert_density(res, eps)
    charts.show(charts.expert_heatmaps(ed, agents), ed,
                "Brighter = denser update; blank = the agent left that expert exactly as the base had it. The last "
                "columns are the shared expert (when the model has one) and the router.", "density_layer_expert",
                title="Density per layer × expert", params=base_params)
    if set(owners["expert"].astype(str)) <= {"fused"}:
        return
    charts.show(charts.expert_owner_map(owners, agents), owners,
                "Each routed expert coloured by who changed it: one agent's colour where only it did (RAM keeps "
                "that update whole), grey where several did (RAM averages there), blank where none did.",
                "experts_changed_by", title="Which agents changed each expert", params=base_params)


with state.guard("Drawing the charts"):
    precision_panel(eps)
    uvc = tables.unique_vs_chance(res, eps)
    chance = dict(zip(uvc["agent"], uvc["chance_unique_share"]))
    left, right, half = pair()
    with left:
        d = tables.global_density(res, eps)
        charts.show(charts.density_bars(d, agents), d,
                    "How sparse is each update? RL agents typically change a small, very different share of weights.",
                    "density_per_agent", title="Density per agent", params=base_params, width=half)
    with right:
        o = tables.overlap_distribution(res, eps)
        charts.show(charts.overlap_stacked(o, agents, chance), o,
                    "Purple = unique to the agent: averaging divides exactly these updates by N (signal dilution). "
                    "Above each bar: its unique share and the chance level of independent masks.",
                    "overlap_distribution", title="Overlap distribution", params=base_params, width=half)

    left, right, half = pair()
    with left:
        charts.show(charts.unique_vs_chance_bars(uvc, agents, log_small), uvc,
                    "Bars: the share of each agent's changed elements no other agent changed. ◆: the same share if "
                    "every agent had changed an independent random set of the same size; ◇: the same, tensor by "
                    "tensor, with each tensor's own densities; ×: per tensor × binade of the base weight (below).",
                    "unique_vs_chance", title="Unique share against chance", params=base_params, width=half)
    with right:
        nc = tables.norms_and_conflicts(res, eps)
        charts.show(charts.norms_conflicts(nc, agents), nc,
                    "Left: how large each agent's unique and shared updates are (L2 norm; the hover gives the unique "
                    "part's share of ‖τ‖²). Right: shared elements where another agent moved the weight the other "
                    "way — where averaging cancels updates.",
                    "norms_and_sign_conflicts", title="Update size by region, and sign conflicts", params=base_params,
                    width=half)
    st.caption(CHANCE_LEVELS)

    view, tower = towers_panel(eps)
    tower_param = {"tower": tower} if tower else {}
    tower_words = f" ({tower} tower)" if tower else ""

    if paper.PAPER_EPS in res.ladder and any(paper.paper_role(a) for a in agents):
        st.subheader("Next to the paper's agents (ε = 1e-5)")
        shown, formats = frames.paper_frame(paper.paper_comparison(res))
        show_table(shown, config=formats)
        st.caption("The paper's Qwen2.5-7B agents (Sec. 3.1) at ε = 1e-5, matched by name (code / tool / memory). "
                   "Density = share of all parameters changed; unique share = share of the agent's changed "
                   "elements that no other *selected* agent changed (the paper's is among its three agents); "
                   "chance = the unique share independent masks of the same densities would give.")

    # ---------------------------------------------------------------- is the overlap real?
    if len(agents) > 1:
        overlap_panel(eps, view)

    # ---------------------------------------------------------------- ρ_t and λ_t
    st.subheader("Overlap-unique ratio ρ_t and the λ_t it gives")
    p = state.tuned()
    lam = tables.lambda_table(res, eps, p["r"], p["alpha"], p["rule"], "global")
    show_table(frames.rho_frame(lam, uvc))
    st.caption(f"ρ_t over the whole model at ε = {charts.eps_label(eps)} (the paper's global scope); λ_t with Tune's "
               f"{state.rule_text(p)}. Below, the same counts per layer, module or "
               "tensor: where an agent's overlap is high or low.")
    c = st.container(horizontal=True, vertical_alignment="bottom", wrap=True)
    by = c.segmented_control("Group by", list(tables.GROUPINGS), default="layer", key="het_rho_by") or "layer"
    what = c.segmented_control("Show", ["ρ", "λ"], default="ρ", key="het_rho_what") or "ρ"
    scope = c.segmented_control("λ scope", ["global", "tensor"], default=p["rho_scope"], key="het_rho_scope",
                                   help="global: one λ_t per agent (paper). tensor: λ from each tensor's own ρ "
                                        "(mergekit ramplus_tl), averaged over the group's unique elements.") or "global"
    log_r = c.toggle("log ρ", value=True, key="het_rho_log", disabled=what == "λ",
                        help="ρ spans decades: draw it on a log scale (labelled at 0.1, 1, 10 …). λ is always linear, "
                             "from 1 (a unique update kept as it is).") and what == "ρ"
    grouped = tables.rho_lambda_by(res, eps, by, p["r"], p["alpha"], p["rule"], scope, tower)
    group_params = {**base_params, "by": by, **state.rule_params(p), "scope": scope, **tower_param}
    value, label = ("rho", "ρ = shared / unique") if what == "ρ" else ("lambda", "λ (unique-update scale)")
    name = f"{'rho' if what == 'ρ' else 'lambda'}_by_{by.replace(' × ', '_')}"
    if by in ("layer", "module"):
        charts.show(charts.group_lines(grouped, agents, by, value, label, log_r, what), grouped,
                    ("ρ per group = shared / unique elements of the agent inside it (gaps: no unique element, ρ = ∞). "
                     if what == "ρ" else
                     "λ that a RAM+ merge with Tune's settings applies to the unique elements of each group. ")
                    + "The CSV has every group's counts, unique share and chance level.",
                    name, title=f"{what} per {by}{tower_words}", params=group_params)
    elif by == "layer × module":
        charts.show(charts.layer_module_heatmaps(grouped.assign(module=grouped["module"].astype(str)), agents, value,
                                                 log=log_r, colorbar=what, scale=1.0), grouped,
                    f"{what} per layer and module kind, one panel per agent (blank: no unique element there, "
                    "or the module is absent).", name, title=f"{what} per layer × module{tower_words}",
                    params=group_params)
    else:
        shown, formats = frames.tensor_frame(grouped)
        show_table(shown, config=formats, height=360)
        st.caption(f"{len(shown):,} rows (agent × tensor), largest unique count first; click a header to sort. "
                   "ρ empty = ∞ (no unique element in the tensor).")
        st.download_button("CSV", csv_later(grouped), f"{charts.export_name(name, group_params)}.csv",
                           "text/csv", key="csv_rho_tensor", icon=":material/download:", type="tertiary")

    # ---------------------------------------------------------------- where
    lm = tables.density_by_layer_module(view, eps)
    charts.show(charts.layer_module_heatmaps(lm, agents), lm,
                "Brighter = denser updates; compare panels to see whether agents concentrate on different modules.",
                "density_layer_module", title=f"Where the changes are: density per layer × module{tower_words}",
                params={**base_params, **tower_param})
    if experts.has_experts(res):
        experts_panel(eps)

    left, right, half = pair()
    with left:
        us = tables.unique_shared_by_layer(view, eps)
        charts.show(charts.unique_share_lines(us, agents, log_small), us,
                    "Higher = more of that layer's update belongs to this agent alone (kept whole by RAM). Dotted: "
                    "the chance level of independent masks with that layer's densities.",
                    "unique_shared_by_layer", title=f"Unique share per layer{tower_words}",
                    params={**base_params, **tower_param}, width=half)
    with right:
        es = tables.eps_sensitivity(res)
        charts.show(charts.eps_curve(es, agents, eps), es,
                    "A flat curve means the sparsity is real, not an artefact of the chosen ε (dotted line).",
                    "eps_sensitivity", title="Density against ε", params={"agents": agents}, width=half)

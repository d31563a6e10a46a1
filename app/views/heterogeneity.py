"""Heterogeneity: how sparse and how disjoint the agents' task vectors are (paper Sec. 3, Fig. 2)."""
from __future__ import annotations

import streamlit as st

from analysis import paper, tables
from app import charts, state

st.title("Heterogeneity")
st.markdown("RL fine-tuning changes few parameters, and different agents change different ones. "
            "One streaming pass over the weights counts, for every ε, which elements each agent changed "
            "(|τ| > ε) and how many other agents changed them too.")

sel = state.selection()
res = state.analysis_or_stop(sel)
agents = res.agents

top = st.columns([3, 1, 2], vertical_alignment="bottom")
eps = top[0].select_slider("ε: an element counts as changed when |τ| > ε", options=list(res.ladder),
                           value=state.DEFAULT_EPS if state.DEFAULT_EPS in res.ladder else res.ladder[0],
                           format_func=charts.eps_label, key="het_eps")
top[0].caption(f"{len(agents)} agents · {state.fmt_count(res.total_params)} parameters · "
               + ("statistics from the cache" if res.from_cache else f"analysed in {res.seconds:.1f} s"))
buttons = top[2].container(horizontal=True, horizontal_alignment="right")
buttons.download_button("All data", res.frame.to_csv(index=False).encode(), "analysis_statistics.csv", "text/csv",
                        key="csv_all_stats", icon=":material/download:",
                        help="Every statistic of the pass: one row per agent × tensor × ε (CSV).")
if buttons.button("Re-run", icon=":material/refresh:", help="Forget the cached result and read the weights again.",
                  key="het_rerun"):
    state.forget_analysis(sel)
    st.rerun()

with state.guard("Drawing the charts"):
    left, right = st.columns(2)
    with left:
        st.subheader("Density per agent")
        d = tables.global_density(res, eps)
        charts.show(charts.density_bars(d, agents), d,
                    "How sparse is each update? RL agents typically change a small, very different share of weights.",
                    "density_per_agent")
    with right:
        st.subheader("Overlap distribution")
        o = tables.overlap_distribution(res, eps)
        charts.show(charts.overlap_stacked(o, agents), o,
                    "Purple = unique to the agent: averaging divides exactly these updates by N (signal dilution).",
                    "overlap_distribution")

    if paper.PAPER_EPS in res.ladder and any(paper.paper_role(a) for a in agents):
        st.subheader("Next to the paper's agents (ε = 1e-5)")
        cmp = paper.paper_comparison(res)
        shown = cmp.rename(columns={"agent": "agent", "paper_agent": "paper's agent",
                                    "density": "density", "paper_density": "paper density",
                                    "unique_share": "unique share of changed",
                                    "paper_unique_share": "paper unique share"})
        pct = {c: st.column_config.NumberColumn(c, format="percent") for c in shown.columns[2:]}
        st.dataframe(shown, hide_index=True, column_config=pct, width="stretch")
        st.caption("The paper's Qwen2.5-7B agents (Sec. 3.1) at ε = 1e-5, matched by name (code / tool / memory). "
                   "Density = share of all parameters changed; unique share = share of the agent's changed "
                   "elements that no other *selected* agent changed (the paper's is among its three agents).")

    st.subheader("Where the changes are: layer × module")
    lm = tables.density_by_layer_module(res, eps)
    charts.show(charts.layer_module_heatmaps(lm, agents), lm,
                "Brighter = denser updates; compare panels to see whether agents concentrate on different modules.",
                "density_layer_module")

    left, right = st.columns(2)
    with left:
        st.subheader("Unique vs shared per layer")
        us = tables.unique_shared_by_layer(res, eps)
        charts.show(charts.unique_share_lines(us, agents), us,
                    "Higher = more of that layer's update belongs to this agent alone (kept whole by RAM).",
                    "unique_shared_by_layer")
    with right:
        st.subheader("ε sensitivity")
        es = tables.eps_sensitivity(res)
        charts.show(charts.eps_curve(es, agents, eps), es,
                    "A flat curve means the sparsity is real, not an artefact of the chosen ε (dotted line).",
                    "eps_sensitivity")

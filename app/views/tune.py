"""Tune: RAM+ parameters against the cached overlap statistics — no weights are re-read."""
from __future__ import annotations

import math
import time

import pandas as pd
import streamlit as st

from analysis import tables
from merging import regions
from app import charts, state

st.title("Tune")
st.markdown("RAM+ scales each agent's **unique** update by λ_t = 1 + r·clip(ρ_t, 0, α) (Eq. 6), or "
            "1 + r·ρ_t/(1+ρ_t) with the soft rule (Eq. 8), where ρ_t = shared_t / unique_t (Eq. 2). "
            "Everything below is recomputed from the cached counts, so it updates instantly.")

sel = state.selection()
res = state.analysis_or_stop(sel)


def lambda_rows(lam: pd.DataFrame) -> pd.DataFrame:
    """The λ_t table as display strings (a static table: readable, copyable, stable in screenshots)."""
    out = pd.DataFrame({
        "agent": lam["agent"],
        "shared": lam["shared"].map(lambda v: f"{int(v):,}"),
        "unique": lam["unique"].map(lambda v: f"{int(v):,}"),
        "ρ_t": lam["rho"].map(lambda v: "∞" if not math.isfinite(v) else f"{v:.4f}"),
        "λ_t": lam["lambda"].map(lambda v: f"{v:.4f}"),
    })
    if "lambda_min" in lam:
        out["λ range (tensors)"] = [f"{a:.3f}–{b:.3f}" for a, b in zip(lam["lambda_min"], lam["lambda_max"])]
    return out.set_index("agent")


@st.fragment
def tuner() -> None:
    t0 = time.perf_counter()
    p = state.tuned()
    ladder = list(res.ladder)
    c = st.columns([2.4, 2, 2, 1.9, 2.1])
    eps = c[0].select_slider("ε (changed when |τ| > ε)", options=ladder,
                             value=p["eps"] if p["eps"] in ladder else ladder[0], format_func=charts.eps_label,
                             key="tune_eps")
    r = c[1].slider("r (rescale strength)", 0.0, 1.0, float(p["r"]), 0.01, key="tune_r",
                    help="Paper: r = 0.1. r = 0 is plain RAM.")
    rule = c[3].radio("λ rule", list(regions.RULES), index=list(regions.RULES).index(p["rule"]), horizontal=True,
                      key="tune_rule", help="clip: Eq. 6 (RAM+). soft: Eq. 8 (RAM+s), no α.")
    alpha = c[2].slider("α (clip bound on ρ)", 0.0, 5.0, float(p["alpha"]), 0.1, key="tune_alpha",
                        disabled=rule == "soft", help="Paper: α = 2.0. Only used by the clip rule.")
    scope = c[4].radio("ρ scope", ["global", "tensor"], index=["global", "tensor"].index(p["rho_scope"]),
                       horizontal=True, key="tune_scope",
                       help="global: ρ_t over the whole model (paper). tensor: per tensor (mergekit ramplus_tl).")
    p.update(eps=eps, r=r, alpha=alpha, rule=rule, rho_scope=scope)
    agents = res.agents
    with state.guard("Computing λ_t"):
        lam = tables.lambda_table(res, eps, r, alpha, rule, scope)
        ret = tables.signal_retention(res, eps, r, alpha, rule, scope)
        ret["method"] = ret["method"].str.replace(r"\(λ=[^)]*\)", "(λ = 1/N)", regex=True)
        left, right = st.columns([1, 1] if scope == "tensor" else [2, 3])
        with left:
            st.subheader("λ_t per agent")
            st.table(lambda_rows(lam))
            st.download_button("CSV", lam.to_csv(index=False).encode(), "lambda_table.csv", "text/csv",
                               key="csv_lambda_table", icon=":material/download:")
            st.caption("λ_t > 1 boosts an agent's unique update to make up for what averaging its shared "
                       "part costs it; the more it overlaps (higher ρ_t), the larger λ_t."
                       + (" Tensor scope: λ_t here is the mean over tensors, weighted by unique elements."
                          if scope == "tensor" else ""))
        with right:
            st.subheader("λ(ρ) with each agent's ρ_t")
            curve_df = lam[["agent", "shared", "unique", "rho", "lambda"]]
            charts.show(charts.lambda_curve(lam, agents, r, alpha, rule), curve_df,
                        ("Each dot is an agent (▶ = ρ_t beyond the axis); past α the clip rule stops growing, so "
                         "heavy overlap cannot explode λ."
                         if rule == "clip" else
                         "Each dot is an agent; the soft rule saturates towards 1 + r, gentler than clipping."),
                        "lambda_curve")
        st.subheader("How much of each agent's unique update survives")
        charts.show(charts.retention_bars(ret, agents), ret,
                    "Averaging and task arithmetic (λ = 1/N) keep only 1/N of a unique update; RAM keeps all of it, "
                    "RAM+ a bit more.", "signal_retention")
    st.caption(f"Recomputed in {1000 * (time.perf_counter() - t0):.0f} ms from cached statistics "
               f"(no weights read).")


tuner()
st.page_link("views/merge.py", label="Merge with these parameters", icon=":material/arrow_forward:")

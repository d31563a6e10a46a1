"""What the pages' tables show: display frames (human headers, one precision per column) built from analysis,
compatibility and merge results. Pages draw them with `app.tables.show_table`; the browser layout test draws
the same frames at every window width."""
from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from app.markup import md
from app.tables import path_end


def pct(v: float) -> str:
    from app.charts import pct as chart_pct

    return chart_pct(v)


def fmt_rho(v) -> str:
    """ρ as the tables write it: 4 significant digits, ∞ for no unique element, – for none."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return "∞" if not math.isfinite(v) else f"{v:.4g}"


def precision_frame(pv: pd.DataFrame, short: dict[str, str]) -> pd.DataFrame:
    """Heterogeneity, ε and the stored number format: per agent, density against one representable step."""
    return pd.DataFrame({
        "agent": pv["agent"].map(short), "density": pv["density"].map(pct),
        "at ε = 0": pv["density_eps0"].map(pct), "one step": pv["one_step_share"].map(pct),
        "one-step Σ τ²": pv["one_step_energy_share"].map(pct)})


def agreement_frame(ag: pd.DataFrame) -> pd.DataFrame:
    """Heterogeneity, is the overlap real: per agent, agreement on its shared elements and its chance levels."""
    return pd.DataFrame({
        "agent": ag["agent"], "shared elements": ag["shared"].map("{:,}".format),
        "same sign (pairs)": ag["sign_agreement"].map(pct), "chance": "50%",
        "all agree": ag["all_agree"].map(pct), "chance (all agree)": ag["chance_all_agree"].map(pct),
        "cosine vs others": ag["cosine_others"].map(lambda v: "–" if v != v else f"{v:+.3f}"),
        "shared energy": ag["shared_energy_share"].map(pct),
        "partners < 10 %": ag["dominated_10_share"].map(pct),
        "partners < 30 %": ag["dominated_30_share"].map(pct),
        "unique share": ag["unique_share"].map(pct),
        "chance (model)": ag["chance_unique_share"].map(pct),
        "chance (per tensor)": ag["chance_unique_share_tensor"].map(pct),
        "chance (tensor × binade)": ag["chance_unique_share_binade"].map(pct)})


def rho_frame(lam: pd.DataFrame, uvc: pd.DataFrame) -> pd.DataFrame:
    """Heterogeneity, ρ_t and λ_t: per agent, its counts, unique share against chance, ρ_t and λ_t."""
    rows = lam.merge(uvc[["agent", "changed", "unique_share", "chance_unique_share"]], on="agent")
    return pd.DataFrame({
        "agent": rows["agent"], "changed": rows["changed"].map("{:,}".format),
        "shared": rows["shared"].map("{:,}".format), "unique": rows["unique"].map("{:,}".format),
        "unique share": rows["unique_share"].map(pct), "chance": rows["chance_unique_share"].map(pct),
        "ρ_t = shared / unique": rows["rho"].map(fmt_rho), "λ_t (Tune's settings)": rows["lambda"].map(
            "{:.4f}".format)})


def paper_frame(cmp: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Heterogeneity, next to the paper's agents: the frame and its percent formats."""
    shown = cmp.rename(columns={"paper_agent": "paper's agent", "paper_density": "paper density",
                                "unique_share": "unique share of changed",
                                "chance_unique_share": "chance (independent masks)",
                                "paper_unique_share": "paper unique share",
                                "paper_chance_unique_share": "paper chance"})
    return shown, {c: st.column_config.NumberColumn(c, format="percent") for c in shown.columns[2:]}


def tensor_frame(grouped: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Heterogeneity, ρ and λ per tensor: every agent × tensor, largest unique count first, human headers."""
    shown = grouped.assign(rho=grouped["rho"].map(lambda v: v if math.isfinite(v) else None))
    shown = shown[["agent", "tensor", "numel", "changed", "shared", "unique", "unique_share",
                   "chance_unique_share", "rho", "lambda", "norm_unique", "sign_conflicts"]]
    shown = shown.sort_values(["agent", "unique"], ascending=[True, False]).rename(columns={
        "numel": "elements", "unique_share": "unique share", "chance_unique_share": "chance", "rho": "ρ",
        "lambda": "λ", "norm_unique": "‖τ_unique‖", "sign_conflicts": "sign conflicts"})
    return shown, {"unique share": st.column_config.NumberColumn(format="percent"),
                   "chance": st.column_config.NumberColumn(format="percent"),
                   "ρ": st.column_config.NumberColumn(format="%.4g", help="empty = ∞"),
                   "λ": st.column_config.NumberColumn(format="%.4f"),
                   "‖τ_unique‖": st.column_config.NumberColumn(format="%.4g")}


def lambda_rows(lam: pd.DataFrame) -> pd.DataFrame:
    """Tune, λ_t per agent, as display strings (a static table: readable, copyable, stable in screenshots)."""
    tensor = "lambda_min" in lam
    out = pd.DataFrame({
        "agent": lam["agent"].map(md),  # st.table renders Markdown: names are escaped
        "shared": lam["shared"].map(lambda v: f"{int(v):,}"),
        "unique": lam["unique"].map(lambda v: f"{int(v):,}"),
        ("ρ_t (whole model)" if tensor else "ρ_t"): lam["rho"].map(fmt_rho),
    })
    if tensor:  # what tensor scope uses: each tensor's own ρ
        out["ρ per tensor: median (range)"] = [
            f"{fmt_rho(m)} ({fmt_rho(a)}–{fmt_rho(b)})"
            for m, a, b in zip(lam["rho_tensor_median"], lam["rho_tensor_min"], lam["rho_tensor_max"])]
        out["λ_t (mean)"] = lam["lambda"].map(lambda v: f"{v:.4f}")
        out["λ range (tensors)"] = [f"{a:.3f}–{b:.3f}" for a, b in zip(lam["lambda_min"], lam["lambda_max"])]
    else:
        out["λ_t"] = lam["lambda"].map(lambda v: f"{v:.4f}")
    return out.set_index("agent")


def compare_frame(cmp: pd.DataFrame) -> pd.DataFrame:
    """Tune, A | B: per agent, ρ_t, λ_t and the unique update kept under each setting."""
    return pd.DataFrame({
        "agent": cmp["agent"].map(md), "ρ_t A": cmp["rho_A"].map(fmt_rho), "ρ_t B": cmp["rho_B"].map(fmt_rho),
        "λ_t A": cmp["lambda_A"].map("{:.4f}".format), "λ_t B": cmp["lambda_B"].map("{:.4f}".format),
        "λ_t B − A": cmp["lambda_change"].map("{:+.4f}".format),
        "unique elements A": cmp["unique_A"].map("{:,}".format),
        "unique elements B": cmp["unique_B"].map("{:,}".format),
        "kept A": cmp["kept_A"].map("{:.4g}".format), "kept B": cmp["kept_B"].map("{:.4g}".format),
        "kept B / A": [f"{kb / ka:.3g}×" if ka else "–" for ka, kb in zip(cmp["kept_A"], cmp["kept_B"])],
    }).set_index("agent")


MODEL_COLUMNS = ["role", "model", "source", "architecture", "params", "tensors", "dtypes", "size on disk",
                 "tied embeddings", "layout"]


def models_frame(frame: pd.DataFrame, refs: list[str]) -> pd.DataFrame:
    """Models, the compatibility report: one row per model (`CompatibilityReport.models_frame`), its source by
    the end of its path, human headers."""
    from app.state import fmt_count
    from merging.common.units import format_bytes

    out = frame.assign(params=frame["params"].map(fmt_count), source=[path_end(r) for r in refs])
    out["size on disk"] = out.pop("bytes_on_disk").map(format_bytes)
    out["tied embeddings"] = out.pop("tied_embeddings").map({True: "yes", False: "no"}).fillna("?")
    return out[[c for c in MODEL_COLUMNS if c in out.columns]]


def lambdas_frame(lambdas: list[dict]) -> pd.DataFrame:
    """Merge & export, the λ_t a merge used: per agent, its counts, ρ_t and λ_t, each column at one precision."""
    d = pd.DataFrame(lambdas)
    out = pd.DataFrame({"agent": d["agent"]})
    for col, name in (("shared", "shared"), ("unique", "unique")):
        if col in d:
            out[name] = d[col].map(lambda v: "–" if v is None or v != v else f"{int(v):,}")
    if "rho" in d:  # no finite ρ: ∞ with shared elements and no unique one, else none at all
        out["ρ_t"] = [fmt_rho(float(v)) if v is not None and v == v else
                      ("∞" if r.get("shared") and not r.get("unique") else "–") for v, r in zip(d["rho"], lambdas)]
    out["λ_t"] = d["lambda"].map(lambda v: f"{float(v):.4f}")
    return out

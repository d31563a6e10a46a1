"""Derived views of an analysis result: tidy frames for the paper's figures, ρ_t and λ_t. No weights read."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from merging.methods.regions import chance_unique_share, lambda_for, rho

from .names import in_module_order
from .stats import AnalysisResult


def _at(result: AnalysisResult, eps: float) -> pd.DataFrame:
    rows = result.frame[result.frame["eps"] == eps]
    if rows.empty:
        raise KeyError(f"ε={eps:g} is not in the analysed ladder {list(result.ladder)}")
    return with_parts(rows)


def with_parts(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with `module` qualified by its MoE role where it has one ("expert gate", "shared down"; routers
    are "router"), so that a module grouping never pools routed experts, the shared expert and a dense MLP."""
    if "role" not in rows:
        return rows
    word = rows["role"].map({"expert": "expert ", "shared_expert": "shared "})
    moe = word.notna()
    if not moe.any():
        return rows
    return rows.assign(module=np.where(moe, word.fillna("") + rows["module"].astype(str), rows["module"]))


def global_density(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Fraction of all parameters each agent changed by more than ε (paper Fig. 2, left)."""
    g = _at(result, eps).groupby("agent", sort=False)[["changed", "shared", "unique"]].sum().reindex(result.agents)
    g["total"] = result.total_params
    g["density"] = g["changed"] / result.total_params
    return g.reset_index()


def unique_vs_chance(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Per agent: density, unique share of its changed elements, and the unique share independent random
    masks of the same densities would give (Π_{j≠i}(1 − d_j)), over the whole model, tensor by tensor
    (`per_tensor_chance`) and per tensor × binade of |w_base| (`chance_unique_share_binade`: within each
    group of elements that share one step of the stored dtype), to tell element-level structure from chance."""
    g = global_density(result, eps)
    g["unique_share"] = (g["unique"] / g["changed"].where(g["changed"] > 0)).fillna(0.0)
    g["chance_unique_share"] = chance_unique_share(list(g["density"]))
    g["chance_unique_share_tensor"] = g["agent"].map(per_tensor_chance(result, eps)).to_numpy()
    binade = _at(result, eps).groupby("agent", sort=False)["chance_unique_binade"].sum().reindex(result.agents)
    g["chance_unique_share_binade"] = (binade.to_numpy() / g["changed"].where(g["changed"] > 0)).fillna(0.0)
    return g


def precision_view(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Per agent at ε: the density, the density at ε = 0 (stored value changed at all), the share of its changed
    elements that moved by exactly one representable value of the stored dtype and their share of the changed
    elements' Σ τ², and the share of all weights where ε is below one step at the base weight."""
    rows = _at(result, eps)
    cols = ["changed", "changed_any", "one_step", "sq_one_step", "norm_unique", "norm_shared"]
    g = rows.assign(norm_unique=rows["norm_unique"] ** 2, norm_shared=rows["norm_shared"] ** 2) \
        .groupby("agent", sort=False)[cols].sum().reindex(result.agents)
    energy = g["norm_unique"] + g["norm_shared"]
    below = rows.drop_duplicates("tensor")["eps_below_step"].sum()
    return pd.DataFrame({
        "agent": result.agents, "density": (g["changed"] / result.total_params).to_numpy(),
        "density_eps0": (g["changed_any"] / result.total_params).to_numpy(),
        "one_step_share": (g["one_step"] / g["changed"].where(g["changed"] > 0)).fillna(0.0).to_numpy(),
        "one_step_energy_share": (g["sq_one_step"] / energy.where(energy > 0)).fillna(0.0).to_numpy(),
        "eps_below_step_share": float(below) / result.total_params if result.total_params else 0.0})


def per_tensor_chance(result: AnalysisResult, eps: float) -> pd.Series:
    """Each agent's unique share if, tensor by tensor, the agents had changed independent random sets of that
    tensor's own densities: Σ_tensors changed·Π_{j≠i}(1 − d_j) / Σ changed. Next to the whole-model chance it
    separates structure (agents updating different tensors) from element-level avoidance or attraction."""
    g = _at(result, eps).groupby("agent", sort=False)[["chance_unique_tensor", "changed"]].sum() \
        .reindex(result.agents).fillna(0.0)
    out = {a: float(ch / c) if c > 0 else 0.0
           for a, ch, c in zip(result.agents, g["chance_unique_tensor"], g["changed"])}
    return pd.Series(out, name="chance_unique_share_tensor")


def overlap_distribution(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Of each agent's changed elements, the share changed by exactly k agents (paper Fig. 2, right)."""
    rows = _at(result, eps)
    ks = [c for c in rows.columns if c.startswith("k") and c[1:].isdigit()]
    g = rows.groupby("agent", sort=False)[ks].sum().reindex(result.agents)
    out = g.reset_index().melt(id_vars="agent", var_name="k", value_name="count")
    out["k"] = out["k"].str[1:].astype(int)
    totals = out.groupby("agent")["count"].transform("sum")
    out["fraction"] = (out["count"] / totals.where(totals > 0)).fillna(0.0)
    return out.sort_values(["agent", "k"], key=lambda s: s.map({a: i for i, a in enumerate(result.agents)})
                           if s.name == "agent" else s).reset_index(drop=True)


def density_by_layer_module(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Density per agent × layer × module kind (layer −1 holds embeddings, final norm, lm_head)."""
    rows = _at(result, eps)
    g = rows.groupby(["agent", "layer", "module"], sort=False)[["changed", "numel"]].sum().reset_index()
    g["density"] = g["changed"] / g["numel"]
    return module_ordered(g).sort_values(["agent", "layer", "module"]).reset_index(drop=True)


def module_ordered(g: pd.DataFrame) -> pd.DataFrame:
    """`g` with its `module` column (if any) an ordered categorical in model order, so sorting, grouping and
    every chart drawn from it follow embeddings, q, k, v, o, gate, up, down, norm, lm_head."""
    if "module" in g:
        g = g.assign(module=pd.Categorical(g["module"].astype(str), in_module_order(g["module"]), ordered=True))
    return g


def _with_chance(g: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Add density (changed / numel) and, within each group of `keys`, the unique share independent random
    masks of the agents' densities would give (Π_{j≠i}(1 − d_j))."""
    g["density"] = (g["changed"] / g["numel"].where(g["numel"] > 0)).fillna(0.0)
    g["chance_unique_share"] = 0.0
    by = keys[0] if len(keys) == 1 else keys  # one key by name: pandas will make a one-element list's keys tuples
    for _, idx in (g.groupby(by, sort=False).groups.items() if keys else [(None, g.index)]):
        g.loc[idx, "chance_unique_share"] = chance_unique_share(list(g.loc[idx, "density"]))
    return g


def unique_shared_by(result: AnalysisResult, eps: float, keys: list[str]) -> pd.DataFrame:
    """Unique vs shared changed elements per agent and group (`keys`, e.g. ["layer"] or ["module"]), with
    density, the unique share and its chance level within the group; groups in order of appearance."""
    g = _at(result, eps).groupby(["agent", *keys], sort=False)[["unique", "shared", "changed", "numel"]].sum()
    g = module_ordered(g.reset_index())
    total = g["unique"] + g["shared"]
    g["unique_share"] = (g["unique"] / total.where(total > 0)).fillna(0.0)
    return _with_chance(g, keys)


def unique_shared_by_layer(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Unique vs shared changed elements per agent and layer, with the unique share and its chance level."""
    return unique_shared_by(result, eps, ["layer"]).sort_values(["agent", "layer"]).reset_index(drop=True)


GROUPINGS = {"layer": ["layer"], "module": ["module"], "layer × module": ["layer", "module"], "tensor": ["tensor"]}


def rho_lambda_by(result: AnalysisResult, eps: float, by: str, r: float, alpha: float, rule: str = "clip",
                  scope: str = "global", tower: str | None = None) -> pd.DataFrame:
    """ρ and λ per agent and group (`by`: layer, module, layer × module or tensor), at ε.

    ρ of a group is shared/unique over its elements (Eq. 2 restricted to the group). λ is what a RAM+
    merge with these settings applies to the group's unique elements: the agent's global λ_t (global
    scope) or the unique-weighted mean of the per-tensor λ (tensor scope; per tensor it is exact). Also the
    group's unique share of the agent's changed elements, its chance level, and the unique update's
    L2 norm there. With `tower`, only that tower's groups (λ_t still from the whole model)."""
    if by not in GROUPINGS:
        raise KeyError(f"unknown grouping {by!r}; use one of {list(GROUPINGS)}")
    keys = GROUPINGS[by]
    rows = _at(result, eps).copy()
    rows["sq_unique"] = rows["norm_unique"] ** 2
    if scope == "global":
        lam = lambda_table(result, eps, r, alpha, rule, "global").set_index("agent")["lambda"]
        rows["lam_u"] = rows["agent"].map(lam) * rows["unique"]
    else:  # each tensor's own λ (a group's row sums its tensors')
        t = tensor_rows(result, eps)
        t["lam_u"] = [lambda_for(int(s), int(u), r, alpha, rule) * int(u) for s, u in zip(t["shared"], t["unique"])]
        per_unit = t.groupby(["unit", "agent"], sort=False)["lam_u"].sum()
        rows["lam_u"] = per_unit.reindex(list(zip(rows["tensor"], rows["agent"]))).to_numpy()
    if tower is not None and "tower" in rows:
        rows = rows[rows["tower"] == tower]
    cols = ["shared", "unique", "changed", "numel", "sq_unique", "lam_u", "sign_conflicts"]
    g = module_ordered(rows.groupby(["agent", *keys], sort=False, observed=True)[cols].sum().reset_index())
    g["rho"] = [rho(int(s), int(u)) for s, u in zip(g["shared"], g["unique"])]
    if scope == "global":
        g["lambda"] = g["agent"].map(lam)
    else:
        g["lambda"] = (g["lam_u"] / g["unique"].where(g["unique"] > 0)).fillna(1.0)
    g["unique_share"] = (g["unique"] / g["changed"].where(g["changed"] > 0)).fillna(0.0)
    g = _with_chance(g, keys)
    g["norm_unique"] = g["sq_unique"] ** 0.5
    order = {a: i for i, a in enumerate(result.agents)}
    g = g.drop(columns=["sq_unique", "lam_u"]).sort_values(
        ["agent", *keys], key=lambda c: c.map(order) if c.name == "agent" else c)
    return g.reset_index(drop=True)


def norms_and_conflicts(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Per agent at ε: L2 norms of the unique and shared parts of τ_t, the unique part's share of the squared
    norm (its 'energy'), and sign conflicts (shared elements where another active agent has the opposite sign)
    as a count and as a share of the shared elements."""
    rows = _at(result, eps)
    g = rows.assign(sq_u=rows["norm_unique"] ** 2, sq_s=rows["norm_shared"] ** 2).groupby("agent", sort=False)[
        ["sq_u", "sq_s", "shared", "unique", "sign_conflicts"]].sum().reindex(result.agents)
    out = pd.DataFrame({"agent": result.agents, "norm_unique": (g["sq_u"] ** 0.5).values,
                        "norm_shared": (g["sq_s"] ** 0.5).values, "shared": g["shared"].values,
                        "unique": g["unique"].values, "sign_conflicts": g["sign_conflicts"].values})
    energy = g["sq_u"] + g["sq_s"]
    out["unique_energy_share"] = (g["sq_u"] / energy.where(energy > 0)).fillna(0.0).values
    out["conflict_share"] = (out["sign_conflicts"] / out["shared"].where(out["shared"] > 0)).fillna(0.0)
    return out


def compare_settings(result: AnalysisResult, a: dict, b: dict) -> pd.DataFrame:
    """Two RAM+ settings side by side (each a dict of eps, r, alpha, rule, rho_scope): per agent, ρ_t, λ_t,
    the unique elements at that ε, and the unique update a RAM+ merge keeps (λ_t × ‖τ_unique‖, in weight
    units, and relative to the agent's own unique update), with B − A."""
    frames = []
    for tag, p in (("A", a), ("B", b)):
        lam = lambda_table(result, p["eps"], p["r"], p["alpha"], p["rule"], p["rho_scope"]).set_index("agent")
        nc = norms_and_conflicts(result, p["eps"]).set_index("agent")
        f = pd.DataFrame(index=pd.Index(result.agents, name="agent"))
        f[f"rho_{tag}"] = lam["rho"]
        f[f"lambda_{tag}"] = lam["lambda"]
        f[f"unique_{tag}"] = lam["unique"].astype("int64")
        f[f"kept_{tag}"] = lam["lambda"] * nc["norm_unique"]
        frames.append(f)
    out = pd.concat(frames, axis=1)
    out["lambda_change"] = out["lambda_B"] - out["lambda_A"]
    out["kept_change"] = out["kept_B"] - out["kept_A"]
    return out.reset_index()


def eps_sensitivity(result: AnalysisResult) -> pd.DataFrame:
    """Density of each agent at every ε of the ladder."""
    g = result.frame.groupby(["agent", "eps"], sort=False)["changed"].sum().reset_index()
    g["density"] = g["changed"] / result.total_params
    return g.sort_values(["agent", "eps"]).reset_index(drop=True)


def tensor_rows(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Per tensor × agent at ε (tensor-major): shared and unique counts, and the unit (frame row label) it is in —
    the tensor itself, or its group when the frame's rows are groups (from the result's per-tensor counts)."""
    c = result.tensor_counts
    if c is None:
        rows = _at(result, eps)
        return pd.DataFrame({"agent": rows["agent"].to_numpy(), "tensor": rows["tensor"].to_numpy(),
                             "unit": rows["tensor"].to_numpy(), "shared": rows["shared"].to_numpy(),
                             "unique": rows["unique"].to_numpy()})
    j = list(result.ladder).index(eps)
    labels = c.labels()
    keep = pd.Series(labels).isin(set(result.frame["tensor"])).to_numpy()  # a tower's result keeps its units
    T, n = int(keep.sum()), len(result.agents)
    return pd.DataFrame({"agent": np.tile(np.asarray(result.agents, dtype=object), T),
                         "tensor": np.repeat(np.asarray(c.names, dtype=object)[keep], n),
                         "unit": np.repeat(labels[keep], n),
                         "shared": c.shared[keep, :, j].reshape(-1), "unique": c.unique[keep, :, j].reshape(-1)})


def rho_table(result: AnalysisResult, eps: float, scope: str = "global") -> pd.DataFrame:
    """ρ_t = shared_t / unique_t (Eq. 2) per agent (global) or per agent × tensor (tensor scope)."""
    if scope == "global":
        g = _at(result, eps).groupby("agent", sort=False)[["shared", "unique"]].sum().reset_index()
    else:
        g = tensor_rows(result, eps)[["agent", "tensor", "shared", "unique"]]
        g = g.groupby(["agent", "tensor"], sort=False)[["shared", "unique"]].sum().reset_index()
    g["rho"] = [rho(int(s), int(u)) for s, u in zip(g["shared"], g["unique"])]
    return g


def lambda_table(result: AnalysisResult, eps: float, r: float, alpha: float, rule: str = "clip",
                 scope: str = "global") -> pd.DataFrame:
    """λ_t for any (r, α, rule, scope) from cached counts (Eq. 6 or 8); tensor scope also gives spread."""
    g = rho_table(result, eps, scope)
    g["lambda"] = [lambda_for(int(s), int(u), r, alpha, rule) for s, u in zip(g["shared"], g["unique"])]
    if scope == "global":
        return g
    # Tensor scope: summarise per agent, weighting each tensor's λ by its unique count (what it scales).
    g["weighted"] = g["lambda"] * g["unique"]
    s = g.groupby("agent", sort=False).agg(shared=("shared", "sum"), unique=("unique", "sum"),
                                           weighted=("weighted", "sum"), lambda_min=("lambda", "min"),
                                           lambda_max=("lambda", "max"))
    s["lambda"] = (s["weighted"] / s["unique"].where(s["unique"] > 0)).fillna(1.0)
    s["rho"] = [rho(int(a), int(b)) for a, b in zip(s["shared"], s["unique"])]  # whole model, for reference
    # What tensor scope actually uses: the per-tensor ρ, summarised over the tensors that hold unique
    # elements (the only ones λ scales), weighted by those elements.
    spread = {agent: _weighted_quantiles(part["rho"], part["unique"]) for agent, part in g.groupby("agent", sort=False)}
    for i, name in enumerate(("rho_tensor_min", "rho_tensor_median", "rho_tensor_max")):
        s[name] = [spread.get(agent, (math.nan,) * 3)[i] for agent in s.index]
    return s.drop(columns="weighted").reset_index()


def _weighted_quantiles(values: pd.Series, weights: pd.Series) -> tuple[float, float, float]:
    """(min, weighted median, max) of `values` over entries with positive weight; NaNs when there are none."""
    keep = weights > 0
    v, w = values[keep].to_numpy(dtype=float), weights[keep].to_numpy(dtype=float)
    if not len(v):
        return (math.nan, math.nan, math.nan)
    order = v.argsort()
    v, w = v[order], w[order]
    median = float(v[(w.cumsum() >= w.sum() / 2).argmax()])
    return float(v[0]), median, float(v[-1])


def signal_retention(result: AnalysisResult, eps: float, r: float, alpha: float, rule: str = "clip",
                     scope: str = "global", ta_lambda: float | None = None) -> pd.DataFrame:
    """Share of each agent's unique update that survives each method: 1/N, λ_TA, 1 (RAM), λ_t (RAM+)."""
    n = len(result.agents)
    lam = lambda_table(result, eps, r, alpha, rule, scope).set_index("agent")["lambda"]
    norms = _at(result, eps).groupby("agent", sort=False)["norm_unique"].apply(lambda s: math.sqrt((s ** 2).sum()))
    ta = 1.0 / n if ta_lambda is None else ta_lambda
    rows = []
    for agent in result.agents:
        for method, factor in [("average", 1.0 / n), (f"task arithmetic (λ={ta:.3g})", ta), ("RAM", 1.0),
                               ("RAM+", float(lam.get(agent, 1.0)))]:
            rows.append({"agent": agent, "method": method, "retention": factor,
                         "unique_norm": float(norms.get(agent, 0.0)),
                         "retained_norm": factor * float(norms.get(agent, 0.0))})
    return pd.DataFrame(rows)


def agents_json(result: AnalysisResult) -> list[dict]:
    """One record per agent per ε: name, eps, changed, shared, unique, density, rho and the precision view
    (the per-tensor × binade chance of the unique share, the one-step shares, the density at ε = 0) (the CLI's
    --json)."""
    out = []
    for eps in result.ladder:
        g = unique_vs_chance(result, eps)
        pv = precision_view(result, eps).set_index("agent")
        for _, row in g.iterrows():
            rho_v = rho(int(row["shared"]), int(row["unique"]))
            p = pv.loc[row["agent"]]
            out.append({"name": row["agent"], "eps": eps, "changed": int(row["changed"]),
                        "shared": int(row["shared"]), "unique": int(row["unique"]),
                        "density": float(row["density"]), "rho": rho_v if math.isfinite(rho_v) else None,
                        "chance_unique_share_binade": float(row["chance_unique_share_binade"]),
                        "one_step_share": float(p["one_step_share"]),
                        "one_step_energy_share": float(p["one_step_energy_share"]),
                        "density_eps0": float(p["density_eps0"])})
    return out

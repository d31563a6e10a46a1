"""Views of an analysis by the checkpoint's structure (merging/reading/structure.py): towers (language, vision,
audio) and the MoE block — density per layer × expert (routed experts, the shared expert, the router) and which
experts each agent changed. No weights read: everything comes from the frame's tower, expert and role columns."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from merging.methods.regions import chance_unique_share
from merging.reading.structure import FUSED, TOWERS

from .stats import AnalysisResult

SHARED, ROUTER = "shared", "router"  # the MoE columns beside the routed experts


def _at(result: AnalysisResult, eps: float) -> pd.DataFrame:
    rows = result.frame[result.frame["eps"] == eps]
    if rows.empty:
        raise KeyError(f"ε={eps:g} is not in the analysed ladder {list(result.ladder)}")
    return rows


def towers(result: AnalysisResult) -> list[str]:
    """The towers the analysed model has, in the usual order (language first); empty for an old frame."""
    if "tower" not in result.frame:
        return []
    present = set(result.frame["tower"].astype(str))
    return [t for t in TOWERS if t in present]


def for_tower(result: AnalysisResult, tower: str) -> AnalysisResult:
    """The same result restricted to one tower's tensors (its per-layer views never mix towers); parameters
    counted over that tower."""
    frame = result.frame[result.frame["tower"] == tower].reset_index(drop=True)
    pairs = result.pairs
    if "tower" in pairs:
        pairs = pairs[pairs["tower"] == tower].reset_index(drop=True)
    first = frame[(frame["eps"] == result.ladder[0]) & (frame["agent"] == result.agents[0])] if len(frame) else frame
    return dataclasses.replace(result, frame=frame, pairs=pairs, total_params=int(first["numel"].sum()))


def tower_density(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Per agent × tower at ε: changed elements, density, unique share of the changed, and its chance level
    (independent masks of the agents' densities in that tower)."""
    g = _at(result, eps).groupby(["agent", "tower"], sort=False)[["changed", "unique", "shared", "numel"]].sum()
    g = g.reset_index()
    g["density"] = (g["changed"] / g["numel"].where(g["numel"] > 0)).fillna(0.0)
    g["unique_share"] = (g["unique"] / g["changed"].where(g["changed"] > 0)).fillna(0.0)
    g["chance_unique_share"] = 0.0
    for _, idx in g.groupby("tower", sort=False).groups.items():
        g.loc[idx, "chance_unique_share"] = chance_unique_share(list(g.loc[idx, "density"]))
    rank = {t: i for i, t in enumerate(TOWERS)}
    order = {a: i for i, a in enumerate(result.agents)}
    return g.sort_values(["tower", "agent"], key=lambda c: c.map(rank if c.name == "tower" else order)) \
        .reset_index(drop=True)


def has_experts(result: AnalysisResult) -> bool:
    """Whether the model has a mixture-of-experts block (routed experts)."""
    return "role" in result.frame and bool((result.frame["role"] == "expert").any())


def expert_columns(values) -> list[str]:
    """MoE columns in order: routed experts by index (or "fused"), then the shared expert, then the router."""
    vals = {str(v) for v in values}
    experts = sorted((v for v in vals if v.isdigit()), key=int)
    return experts + [v for v in (FUSED, SHARED, ROUTER) if v in vals]


def expert_density(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Density per agent × layer × MoE column at ε: each routed expert (its gate, up and down together), the
    shared expert, the router; `changed` 0 means the agent left that expert exactly as the base had it."""
    rows = _at(result, eps)
    rows = rows[rows["role"] != ""]
    column = np.where(rows["role"] == "expert", rows["expert"].astype(str),
                      np.where(rows["role"] == "shared_expert", SHARED, ROUTER))
    g = rows.assign(column=column).groupby(["agent", "layer", "column"], sort=False)[["changed", "numel"]].sum()
    g = g.reset_index()
    g["density"] = (g["changed"] / g["numel"].where(g["numel"] > 0)).fillna(0.0)
    cols = {c: i for i, c in enumerate(expert_columns(g["column"]))}
    order = {a: i for i, a in enumerate(result.agents)}
    return g.sort_values(["agent", "layer", "column"], key=lambda c: c.map(
        order if c.name == "agent" else cols) if c.name != "layer" else c).reset_index(drop=True)


def expert_owners(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Per layer × routed expert at ε: which agents changed it (any element by more than ε), how many, and
    each agent's density there — routing leaves the experts an agent never used exactly unchanged."""
    d = expert_density(result, eps)
    d = d[~d["column"].isin([SHARED, ROUTER])]
    wide = d.pivot_table(index=["layer", "column"], columns="agent", values="changed", aggfunc="sum", sort=False)
    wide = wide.reindex(columns=result.agents).fillna(0)
    out = wide.index.to_frame(index=False).rename(columns={"column": "expert"})
    changed = wide.to_numpy() > 0
    out["agents"] = [", ".join(a for a, c in zip(result.agents, row) if c) for row in changed]
    out["n_agents"] = changed.sum(axis=1)
    for i, a in enumerate(result.agents):
        out[f"changed:{a}"] = changed[:, i]
    cols = {c: i for i, c in enumerate(expert_columns(out["expert"]))}
    return out.sort_values(["layer", "expert"], key=lambda c: c.map(cols) if c.name == "expert" else c) \
        .reset_index(drop=True)


def expert_summary(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Per agent at ε: routed experts (layer × expert) it changed, of how many, how many only it changed, and
    its density in the routed experts, the shared expert and the router."""
    owners = expert_owners(result, eps)
    d = expert_density(result, eps)
    rows = []
    for a in result.agents:
        mine = owners[f"changed:{a}"]
        part = d[d["agent"] == a]

        def density(sel) -> float:
            p = part[sel]
            return float(p["changed"].sum() / p["numel"].sum()) if p["numel"].sum() else float("nan")

        rows.append({"agent": a, "experts": len(owners), "experts_changed": int(mine.sum()),
                     "experts_only_this_agent": int((mine & (owners["n_agents"] == 1)).sum()),
                     "density_routed": density(~part["column"].isin([SHARED, ROUTER])),
                     "density_shared": density(part["column"] == SHARED),
                     "density_router": density(part["column"] == ROUTER)})
    return pd.DataFrame(rows)

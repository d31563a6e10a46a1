"""Task-vector statistics of the demo agents, computed with the library's streaming analysis.

The shared / unique rule and the chance yardstick live once, in the library (`analysis.stats.analyze`,
`analysis.tables.unique_vs_chance`, `overlap_distribution`, `rho_table`; `merging.methods.regions.chance_unique_share`:
if agents with densities d_1 … d_N changed independent random sets of elements, agent i's unique share
of its changed elements would be Π_{j≠i} (1 − d_j)); this module only arranges their output into the
demo's tables.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from analysis import tables
from analysis.paper import PAPER_AGENTS
from analysis.stats import AnalysisResult
from analysis.stats import analyze as _library_analyze
from merging.methods.regions import chance_unique_share

LADDER: tuple[float, ...] = (0.0, 1e-6, 1e-5, 1e-4, 1e-3)
PAPER_EPS = 1e-5


def chance_rho(chance_unique: float) -> float:
    """ρ_t = shared/unique that independent random masks with this chance unique share give."""
    return (1.0 - chance_unique) / chance_unique if chance_unique > 0 else math.inf


def run_analysis(base_dir: Path, agent_dirs: Mapping[str, Path] | Sequence[Path],
                 ladder: Sequence[float] = LADDER) -> AnalysisResult:
    """One streaming pass of the library over base + agents (no on-disk cache: build outputs
    are rewritten in place). Agents are labelled by the mapping's keys, else by folder names."""
    dirs = list(agent_dirs.values()) if isinstance(agent_dirs, Mapping) else list(agent_dirs)
    result = _library_analyze(str(base_dir), [str(d) for d in dirs], ladder=ladder,
                              use_cache=False)
    if isinstance(agent_dirs, Mapping):
        rename = dict(zip(result.agents, agent_dirs.keys()))
        result.frame["agent"] = result.frame["agent"].map(rename)
        result.agents = list(agent_dirs.keys())
    return result


def summary(result: AnalysisResult, eps: float = PAPER_EPS) -> pd.DataFrame:
    """One row per agent at ε: density, changed / shared / unique counts, unique share of changed,
    the chance unique share and ρ, the measured ρ_t, the overlap histogram (share of the agent's
    changed elements changed by exactly k agents), and the paper's numbers for the same role."""
    dens = tables.unique_vs_chance(result, eps).set_index("agent")
    rho = tables.rho_table(result, eps).set_index("agent")["rho"]
    hist = tables.overlap_distribution(result, eps).pivot(index="agent", columns="k",
                                                          values="fraction")
    rows = []
    for agent in result.agents:
        d = dens.loc[agent]
        row = {"agent": agent, "eps": eps, "params": int(result.total_params),
               "changed": int(d["changed"]), "shared": int(d["shared"]), "unique": int(d["unique"]),
               "density": float(d["density"]), "unique_share": float(d["unique_share"]),
               "chance_unique_share": float(d["chance_unique_share"]),
               "rho": float(rho.loc[agent]), "chance_rho": chance_rho(float(d["chance_unique_share"]))}
        for k in hist.columns:
            row[f"frac_overlap_{k}"] = float(hist.loc[agent, k])
        paper = PAPER_AGENTS.get(agent, {})
        row["paper_density"] = paper.get("density")
        row["paper_unique_share"] = paper.get("unique")
        row["paper_chance_unique_share"] = _paper_chance().get(agent)
        rows.append(row)
    return pd.DataFrame(rows)


def _paper_chance() -> dict[str, float]:
    """The chance unique share of the paper's three agents (from their densities)."""
    names = list(PAPER_AGENTS)
    chance = chance_unique_share([PAPER_AGENTS[n]["density"] for n in names])
    return dict(zip(names, chance))


def ladder_summary(result: AnalysisResult) -> pd.DataFrame:
    """`summary` at every ε of the analysed ladder, stacked."""
    return pd.concat([summary(result, e) for e in result.ladder], ignore_index=True)


def by_module(result: AnalysisResult, eps: float = PAPER_EPS) -> pd.DataFrame:
    """Density and unique share per agent and module kind (embedding, attention, MLP, ...), summed
    over layers: where the changes are."""
    g = tables.unique_shared_by(result, eps, ["module"])
    return g[["agent", "module", "numel", "changed", "unique", "density", "unique_share"]].assign(eps=eps)

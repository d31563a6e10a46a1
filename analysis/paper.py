"""The paper's measured task-vector heterogeneity (Sec. 3.1, Fig. 2), to set our numbers beside it."""
from __future__ import annotations

import re

import pandas as pd

from merging.methods.regions import chance_unique_share

from . import tables
from .stats import AnalysisResult

# Qwen2.5-7B-Instruct agents at ε = 1e-5: share of parameters changed, and share of each agent's
# changed elements that no other agent changed (paper Sec. 3.1).
PAPER_AGENTS: dict[str, dict[str, float]] = {
    "code": {"density": 0.032, "unique": 0.063},
    "tool": {"density": 0.462, "unique": 0.408},
    "memory": {"density": 0.543, "unique": 0.475},
}
PAPER_EPS = 1e-5
# A role's word must start a word of the label ("Qwen-Coder", "ToolRL"), or be "coder" inside one
# ("DeepCoder"); "decoder", "encoder" and "unicode" are not coding agents.
_ROLE_PATTERNS = {"code": re.compile(r"(?<![a-z])code|(?<!de)(?<!en)coder"),
                  "tool": re.compile(r"(?<![a-z])tool"),
                  "memory": re.compile(r"(?<![a-z])mem(ory|agent)")}


def paper_role(agent: str) -> str | None:
    """The paper agent ("code", "tool", "memory") whose name appears in an agent's label."""
    name = agent.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].rsplit(":", 1)[-1].lower()
    return next((role for role, pattern in _ROLE_PATTERNS.items() if pattern.search(name)), None)


def paper_comparison(result: AnalysisResult, eps: float = PAPER_EPS) -> pd.DataFrame:
    """Per agent: measured density and unique share at ε next to the paper's agent of that role."""
    dens = tables.unique_vs_chance(result, eps).set_index("agent")
    paper_chance = dict(zip(PAPER_AGENTS, chance_unique_share([a["density"] for a in PAPER_AGENTS.values()])))
    rows = []
    for agent in result.agents:
        role = paper_role(agent)
        paper = PAPER_AGENTS.get(role or "", {})
        rows.append({"agent": agent, "paper_agent": role or "", "density": dens.loc[agent, "density"],
                     "paper_density": paper.get("density"), "unique_share": dens.loc[agent, "unique_share"],
                     "chance_unique_share": dens.loc[agent, "chance_unique_share"],
                     "paper_unique_share": paper.get("unique"), "paper_chance_unique_share": paper_chance.get(role)})
    return pd.DataFrame(rows)

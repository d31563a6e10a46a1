"""Every chart builder of `app.charts` drawn from a real analysis of agents named like the paper's (2–8 of them): the
cases tests/app/charts/test_chart_rules.py checks as figures and the browser chart gallery
(tests/browser/chart_gallery.py) draws in chromium."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

# The paper's three agents first, then RL agents named the way Hub repositories are (long, sharing parts).
LONG_NAMES = ["ReasonFlux-Coder-7B", "Qwen2.5-7B-Instruct-ToolRL-grpo-cold", "RL-MemoryAgent-7B",
              "Qwen2.5-7B-Instruct-SearchR1-ppo-warm", "DeepSeek-R1-Distill-Qwen-7B-MathRL",
              "OpenThinker-7B-agentic-grpo", "Qwen2.5-7B-Instruct-WebShop-RL", "SWE-RL-Qwen2.5-7B-Coder-grpo"]
EPS = 1e-5


def long_named_result(root: Path, n: int):
    """A tiny base and `n` sparse agents in folders named LONG_NAMES[:n], analysed (labels = folder names)."""
    from analysis.stats import analyze
    from tests.factory import make_agent, make_base

    base = make_base(root / "Qwen2.5-7B-Instruct")
    agents = [make_agent(base, root / name, 0.05 + 0.4 * i / max(n - 1, 1), seed=200 + i)
              for i, name in enumerate(LONG_NAMES[:n])]
    return analyze(base, agents, ladder=(0.0, 1e-6, EPS, 1e-3), use_cache=False)


def cases(res) -> dict[str, tuple[object, str, float]]:
    """name → (figure, title, share of the page's width it is drawn at in the app)."""
    from analysis import agreement, tables
    from app import charts

    ag = list(res.agents)
    half = 0.5 if len(ag) <= charts.WRAP_UP_TO else 1.0  # as the Heterogeneity page lays them out
    lam = tables.lambda_table(res, EPS, 0.1, 2.0)
    ret = tables.signal_retention(res, EPS, 0.1, 2.0, "clip", "global", ta_lambda=1.0)
    a = {"eps": EPS, "r": 0.1, "alpha": 2.0, "rule": "clip", "rho_scope": "global"}
    cmp = tables.compare_settings(res, a, {**a, "eps": 1e-3, "r": 0.3})
    demo = pd.DataFrame({"model": ["base", *ag, "task arithmetic (λ = 1.0)", "ram_plus (this session's setting)"]})
    for t in ("code", "tool", "memory", "avg"):
        demo[t] = [20.0 + 3 * i for i in range(len(demo))]
    fig3 = pd.DataFrame([{"agent": x, "variant": v, "task": "code", "split": "test", "accuracy": 30.0 + j}
                         for x in ag for j, v in enumerate(("base", "unique", "unique_div_N", "agent"))])
    log = pd.DataFrame([{"agent": x, "step": s, "reward": (s % 7) / 7} for x in ag for s in range(30)])
    out = {
        "density_per_agent": (charts.density_bars(tables.global_density(res, EPS), ag), "Density per agent", half),
        "overlap_distribution": (charts.overlap_stacked(tables.overlap_distribution(res, EPS), ag,
                                                        dict(tables.unique_vs_chance(res, EPS).set_index("agent")[
                                                            "chance_unique_share"])),
                                 "Overlap distribution", half),
        "unique_vs_chance": (charts.unique_vs_chance_bars(tables.unique_vs_chance(res, EPS), ag, log=True),
                             "Unique share against chance", half),
        "norms_and_sign_conflicts": (charts.norms_conflicts(tables.norms_and_conflicts(res, EPS), ag),
                                     "Update size by region, and sign conflicts", half),
        "rho_by_module": (charts.group_lines(tables.rho_lambda_by(res, EPS, "module", 0.1, 2.0), ag, "module", "rho",
                                             "ρ = shared / unique", True, "ρ"), "ρ per module", 1.0),
        "lambda_by_layer": (charts.group_lines(tables.rho_lambda_by(res, EPS, "layer", 0.1, 2.0), ag, "layer",
                                               "lambda", "λ (unique-update scale)", True, "λ"), "λ per layer", 1.0),
        "lambda_by_layer_module": (charts.layer_module_heatmaps(
            tables.rho_lambda_by(res, EPS, "layer × module", 0.1, 2.0, "clip", "tensor"), ag, "lambda", log=True,
            colorbar="λ", scale=1.0), "λ per layer × module", 1.0),
        "rho_by_layer_module": (charts.layer_module_heatmaps(
            tables.rho_lambda_by(res, EPS, "layer × module", 0.1, 2.0), ag, "rho", log=True, colorbar="ρ", scale=1.0),
            "ρ per layer × module", 1.0),
        "density_layer_module": (charts.layer_module_heatmaps(tables.density_by_layer_module(res, EPS), ag),
                                 "Where the changes are: density per layer × module", 1.0),
        "unique_shared_by_layer": (charts.unique_share_lines(tables.unique_shared_by_layer(res, EPS), ag, True),
                                   "Unique share per layer", half),
        "eps_sensitivity": (charts.eps_curve(tables.eps_sensitivity(res), ag, EPS), "Density against ε", half),
        "lambda_curve": (charts.lambda_curve(lam, ag, 0.1, 2.0, "clip", True), "λ(ρ) with each agent's ρ_t", 0.6),
        "signal_retention": (charts.retention_bars(ret, ag), "How much of each agent's unique update survives", 1.0),
        "compare_a_b": (charts.compare_bars(cmp, ag), "Setting A | setting B", 1.0),
        "measured_a_b": (charts.measured_bars(pd.DataFrame({
            "task": ["code", "tool", "memory", "average"], "A": [30.0, 50.0, 40.0, 40.0], "A_se": [2.6, 2.9, 2.8, 1.6],
            "B": [31.0, 52.0, 38.0, 40.3], "B_se": [2.7, 2.9, 2.8, 1.6]}), ag), "Settings A and B, measured", 1.0),
        "table1": (charts.table1_bars(demo, "model", ["code", "tool", "memory", "avg"], ag),
                   "Accuracy per model (mini Table 1)", 1.0),
        "fig3": (charts.fig3_bars(fig3, ag), "Is the skill in the unique region?", 1.0),
        "reward_curves": (charts.reward_curves(log, ag, "step", "reward", "agent"), "RL training reward", 1.0),
    }
    if len(ag) > 1:
        out |= {
            "overlap_pair_matrix": (charts.pair_matrix(agreement.pair_agreement(res, EPS), ag),
                                    "Do the agents' shared updates agree?", 1.0),
            "overlap_energy_profile": (charts.energy_profile(agreement.agent_agreement(res, EPS), ag),
                                       "Where each agent's update energy lies", 1.0),
            "agreement_by_module": (charts.agreement_by_group(agreement.agreement_by(res, EPS, "module"), ag, "module"),
                                    "Where does agreement concentrate?", 1.0),
        }
    return out


def subtitle(res) -> str:
    """The subtitle the app writes for most charts: ε and every agent's full name."""
    from app import charts

    return charts.subtitle_of({"eps": EPS, "agents": list(res.agents)})

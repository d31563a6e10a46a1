"""The charts tests/chart_cases.py does not build from an analysis — the Sweep page's three, the toy's heatmaps,
the towers and the mixture-of-experts charts — on synthetic frames of the shapes the pages pass (agents named
like the paper's), for the browser layout test's gallery page."""
from __future__ import annotations

import numpy as np
import pandas as pd

TASKS = ["code", "tool", "memory"]


def _sweep(agents: list[str]):
    from app import charts

    rs = [0.0, 0.05, 0.1, 0.15, 0.2]
    rows = [{"candidate": f"ram_plus eps=1e-05 r={r} alpha=2.0 rho_scope=global", "r": r, "code": 40 + 10 * r,
             "tool": 50 - 5 * r, "memory": 45.56, "average": 45.1 + r, "average_se": 1.6, "code_se": 2.8,
             "tool_se": 2.9, "memory_se": 2.8, "within_noise": r > 0.05} for r in rs]
    lines = pd.DataFrame(rows)
    methods = [("ram_plus", {"eps": 1e-5, "r": 0.2, "alpha": 2.0}), ("ties", {"lambda": 1.0, "density": 0.2}),
               ("task_arithmetic", {"lambda": 0.7}), ("dare_ties", {"lambda": 1.0, "drop_rate": 0.3})]
    chosen = [{"name": f"{m} {p}", "short": charts.short_candidate(m, p, list(p)), "code": 41.0, "tool": 52.5,
               "memory": 44.0, "average": 45.8, "average_se": 1.6} for m, p in methods]
    models = charts.short_labels(["Qwen2.5-7B-Instruct", *agents])
    chosen += [{"name": a, "short": models[a], "code": 30.0, "tool": 40.0, "memory": 35.0, "average": 35.0,
                "average_se": 1.5} for a in ["Qwen2.5-7B-Instruct", *agents]]
    bars = pd.DataFrame(chosen)
    bars["short"] = charts.short_candidate_labels(list(bars["short"]), limit=20)
    times = pd.DataFrame([{"candidate": f"{m} {i}", "method": m, "merge_s": 0.5 + i, "fisher_s": 0.0,
                           "average": 44.0 + i, "average_se": 1.6, "selected": i == 1}
                          for m, _ in methods for i in range(3)])
    return {"sweep_chosen": (charts.sweep_task_bars(bars, TASKS, agents), "Chosen candidates and the agents"),
            "sweep_param": (charts.sweep_param_lines(lines, "r", TASKS, agents), "ram_plus: score against r"),
            "sweep_time": (charts.sweep_time_scatter(times), "Score against merge time")}


def _structure(agents: list[str]):
    from app import charts

    rng = np.random.default_rng(0)
    towers = pd.DataFrame([{"agent": a, "tower": t, "density": rng.uniform(0.01, 0.5), "changed": 1000,
                            "unique_share": rng.uniform(0.1, 0.7), "chance_unique_share": rng.uniform(0.1, 0.7)}
                           for a in agents for t in ("language", "vision")])
    columns = [str(e) for e in range(16)] + ["shared", "router"]
    dens = pd.DataFrame([{"agent": a, "layer": lay, "column": c, "density": rng.uniform(0, 0.3),
                          "changed": int(rng.integers(0, 3)) * 100} for a in agents for lay in range(6)
                         for c in columns])
    owners = pd.DataFrame([{"layer": lay, "expert": str(e), **{f"changed:{a}": bool(rng.integers(0, 2))
                                                               for a in agents}}
                           for lay in range(6) for e in range(16)])
    return {"density_per_tower": (charts.tower_bars(towers, agents), "Density per tower"),
            "unique_share_per_tower": (charts.tower_bars(towers, agents, "unique_share"), "Unique share per tower"),
            "density_layer_expert": (charts.expert_heatmaps(dens, agents), "Density per layer × expert"),
            "experts_changed_by": (charts.expert_owner_map(owners, agents), "Which agents changed each expert")}


def _toy():
    from app import charts

    rng = np.random.default_rng(1)
    names = ["A1", "A2", "A3", "average", "RAM", "RAM+"]
    panels = [(f"τ of {n}" if n.startswith("A") else n, rng.normal(size=(6, 8))) for n in names]
    colors = [*charts.toy_colors(names[:3]).values(), None, None, None]
    return {"toy_heatmaps": (charts.toy_heatmaps(panels, 3.0, colors, 3), "Toy task vectors and their merges")}


def extra_cases(agents: list[str]) -> dict[str, tuple[object, str]]:
    """name → (figure, title) of every chart the gallery adds to tests/chart_cases.py's."""
    return {**_sweep(agents), **_structure(agents), **_toy()}

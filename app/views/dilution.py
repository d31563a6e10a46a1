"""Signal dilution: a toy you can play with, then the demo's measured evidence."""
from __future__ import annotations

import pandas as pd
import streamlit as st
from analysis.toy import COLS, ROWS, TOY_EPS, toy_rho_lambda, toy_taus, unique_retention
from app import charts, state
from merging.tensor_merge import merge_in_memory

def demo_agent_labels() -> list[str]:
    """The demo agents' labels in the order that fixes their colours elsewhere in the app."""
    demo = state.demo_selection()
    return [a.split(":", 1)[-1] for a in demo.agents] if demo else []


st.title("Signal dilution")
st.markdown(
    "A task vector τ_t = θ_t − θ_0 is what RL fine-tuning changed. RL changes **few** weights, and "
    "**different** agents change **different** ones. Averaging N task vectors divides every element by N — "
    "fine where agents agree, but where only one agent changed a weight its update simply shrinks to 1/N: the "
    "**signal dilution** of the paper (Sec. 3.2). **RAM** averages only where agents overlap and keeps unique "
    "updates whole; **RAM+** also boosts unique updates by λ_t to compensate for what averaging cost the agent.")

p = state.tuned()
c = st.columns([1, 5])
n = c[0].slider("Agents N", 2, 5, 3, key="toy_n")
seed = c[0].number_input("Seed", 0, 999, 0, key="toy_seed")
defaults = [(0.08, 0.6), (0.35, 0.4), (0.5, 0.3), (0.2, 0.5), (0.15, 0.2)]
names = [f"A{i + 1}" for i in range(n)]
dcols = c[1].columns(max(n, 3))
densities, overlaps = [], []
for i, nm in enumerate(names):
    with dcols[i].container(border=True):
        densities.append(st.slider(f"{nm} density", 0.02, 0.6, defaults[i][0], 0.01, key=f"toy_d{i}",
                                   help="Share of the toy parameters this agent changed."))
        overlaps.append(st.slider(f"{nm} overlap", 0.0, 1.0, defaults[i][1], 0.05, key=f"toy_o{i}",
                                  help="Share of its changes inside the region other agents change too."))

with state.guard("The toy example"):
    taus = toy_taus(densities, overlaps, int(seed))
    ram_plus = {"eps": TOY_EPS, "r": p["r"], "alpha": p["alpha"], "rho_scope": "global"}
    merged = {"average": merge_in_memory("average", taus),
              "RAM": merge_in_memory("ram", taus, {"eps": TOY_EPS}),
              "RAM+": merge_in_memory("ram_plus", taus, ram_plus)}
    zmax = float(taus.abs().max()) or 1.0
    panels = [(f"τ of {nm}", taus[i].view(ROWS, COLS).numpy()) for i, nm in enumerate(names)]
    cols = max(n, len(merged))
    panels += [(None, None)] * (cols - n)  # merged results start on their own row
    panels += [(f"merged: {m}", tm.view(ROWS, COLS).numpy()) for m, tm in merged.items()]
    colors = [charts.agent_colors(names)[nm] for nm in names] + [None] * (len(panels) - n)
    grid = pd.DataFrame([{"panel": t, "row": r, "col": cc, "value": float(g[r][cc])}
                         for t, g in panels if t for r in range(ROWS) for cc in range(COLS)])
    charts.show(charts.toy_heatmaps(panels, zmax, colors, cols), grid,
                "Pale cells under 'average' are unique updates shrunk to 1/N; RAM keeps their full colour.",
                "toy_heatmaps")
    ret = unique_retention(taus, merged, names)
    charts.show(charts.retention_bars(ret, names), ret,
                f"On each agent's unique cells, averaging keeps 1/{n} of the update; RAM keeps 100%, RAM+ λ_t = "
                f"1 + r·clip(ρ_t, 0, α) with r={p['r']:g}, α={p['alpha']:g} from Tune.",
                "toy_retention")

st.divider()
st.header("Measured on the demo")
st.markdown("The bundled demo trains three tiny RL agents (code, tool, memory) from one base, merges them, and "
            "scores every model on the three tasks.")
results = state.demo_results()
table1, log, acc = results / "table1.csv", results / "training_log.csv", results / "accuracy.csv"
if not table1.exists() and not log.exists():
    st.info("The demo's results are not here yet (`assets/demo/results/table1.csv`, `training_log.csv`). They are "
            "produced by `python -m assets.demo.build`; this section fills in once they exist.",
            icon=":material/hourglass_empty:")
if table1.exists():
    with state.guard("Reading table1.csv"):
        st.subheader("Accuracy per model (mini Table 1)")
        t = pd.read_csv(table1)
        first = t.columns[0]
        metrics = [col for col in ("code", "tool", "memory", "avg") if col in t.columns] or [
            col for col in t.columns[1:] if pd.api.types.is_numeric_dtype(t[col]) and "@" not in str(col)][:6]
        charts.show(charts.table1_bars(t, first, metrics, demo_agent_labels()), t,
                    "Look at each task's bar for RAM/RAM+ vs averaging: the unique skills should survive the merge.",
                    "table1")
elif acc.exists():
    with state.guard("Reading accuracy.csv"):
        st.subheader("Accuracy of the base and the agents")
        wide = state.demo_accuracy()[0].reset_index(names="model")
        tasks = [t for t in ("code", "tool", "memory", "avg") if t in wide.columns]
        charts.show(charts.table1_bars(wide, "model", tasks, demo_agent_labels()), wide,
                    "Each agent should beat the base on its own task; the merges join this chart once "
                    "table1.csv exists.", "accuracy")
if log.exists():
    with state.guard("Reading training_log.csv"):
        st.subheader("RL reward during training")
        lg = pd.read_csv(log)
        if "stage" in lg.columns and (lg["stage"] == "rl").any():
            lg = lg[lg["stage"] == "rl"]
        ycol = next((col for col in lg.columns if "reward" in col), None)
        group = "agent" if "agent" in lg.columns else ("task" if "task" in lg.columns else None)
        if ycol is None or group is None or "step" not in lg.columns:
            st.dataframe(lg, width="stretch")
        else:
            agents = demo_agent_labels() or sorted(lg[group].astype(str).unique())
            charts.show(charts.reward_curves(lg, agents, "step", ycol, group), lg,
                        "Solid = moving average: each agent's reward should climb on its own task — the skill "
                        "its task vector carries.",
                        "reward_curves")

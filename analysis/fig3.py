"""The paper's Fig. 3 experiment in tidy form: keep only one agent's unique region (whole, or divided by N as
averaging would) and score it, next to the base and the full agent.

The demo writes it as `assets/demo/results/fig3.csv`, the app's "run on these models" button as a frame of the
same rows. `normalise` accepts either and the naming variants such a file may use; `own_task` picks, for each
agent, the rows of the task it was trained for."""
from __future__ import annotations

import pandas as pd

COLUMNS = ["agent", "variant", "task", "split", "accuracy"]
VARIANTS = ("base", "unique", "unique_div_N", "agent")
_AGENT_COLS = ("agent", "kept_agent", "unique_of", "source_agent")
_VARIANT_COLS = ("variant", "kind", "setting", "method", "model")
_VARIANT_NAMES = {
    "base": "base", "unique": "unique", "unique_only": "unique", "unique-only": "unique", "keep": "unique",
    "unique_div_n": "unique_div_N", "unique/n": "unique_div_N", "unique_divided": "unique_div_N",
    "unique_dilute": "unique_div_N", "unique_diluted": "unique_div_N", "diluted": "unique_div_N",
    "dilute": "unique_div_N", "unique_only_dilute": "unique_div_N",
    "agent": "agent", "full": "agent", "full_agent": "agent", "finetuned": "agent", "fine-tuned": "agent",
}


class Fig3FormatError(ValueError):
    """The file does not have the columns the experiment needs."""


def _pick(frame: pd.DataFrame, names: tuple[str, ...]) -> str | None:
    lower = {c.lower(): c for c in frame.columns}
    return next((lower[n] for n in names if n in lower), None)


def normalise(frame: pd.DataFrame) -> pd.DataFrame:
    """Tidy rows [agent, variant, task, split, accuracy (%)], variant ∈ base | unique | unique_div_N | agent
    (other variants are kept as written). Accuracy given as a fraction (all ≤ 1) becomes a percentage; a
    `subset` column keeps only its 'all' rows; base rows may leave the agent empty."""
    df = frame.copy()
    variant_col = _pick(df, _VARIANT_COLS)
    task_col = _pick(df, ("task",))
    acc_col = _pick(df, ("accuracy", "acc", "accuracy_pct", "score"))
    if variant_col is None or task_col is None or acc_col is None:
        raise Fig3FormatError("needs a variant, a task and an accuracy column; it has "
                              + ", ".join(map(str, frame.columns)))
    if (subset := _pick(df, ("subset",))) is not None:
        df = df[df[subset].astype(str).isin(["all", "nan", ""])]
    agent_col = _pick(df, _AGENT_COLS)
    split_col = _pick(df, ("split",))
    raw = df[variant_col].astype(str).str.strip()
    if "dilute" in {c.lower() for c in df.columns} and variant_col.lower() != "dilute":
        flag = df[_pick(df, ("dilute",))].astype(str).str.lower().isin(["true", "1", "yes"])
        raw = raw.where(~(raw.str.lower().isin(["unique", "unique_only"]) & flag), "unique_div_N")
    out = pd.DataFrame({
        "agent": (df[agent_col].astype("string").fillna("").str.strip() if agent_col else ""),
        "variant": raw.map(lambda v: _VARIANT_NAMES.get(v.lower(), v)),
        "task": df[task_col].astype(str).str.strip(),
        "split": df[split_col].astype(str) if split_col else "test",
        "accuracy": pd.to_numeric(df[acc_col], errors="coerce"),
    })
    n_col = _pick(df, ("n",))
    if n_col is not None:  # examples per row: the accuracy's standard error can be drawn
        out["n"] = pd.to_numeric(df[n_col], errors="coerce").to_numpy()
    out = out.dropna(subset=["accuracy"])
    if len(out) and out["accuracy"].max() <= 1.0:
        out["accuracy"] = 100 * out["accuracy"]
    # 'agent' rows may name the agent in the variant column's model field (e.g. model=code): keep them.
    out.loc[(out["variant"] == "agent") & (out["agent"] == ""), "agent"] = out["task"]
    return out.reset_index(drop=True)[COLUMNS + (["n"] if n_col is not None else [])]


def own_task(tidy: pd.DataFrame, agents: list[str], split: str = "test") -> pd.DataFrame:
    """For each agent, its own task's rows (the task named like the agent): base, unique, unique ÷ N and the
    full agent, one row per variant, ready to draw, with the accuracy's binomial standard error `se` where the
    rows say how many examples (`n`). Agents without a task of their name are left out."""
    from .noise import binomial_se

    part = tidy[tidy["split"] == split] if (tidy["split"] == split).any() else tidy
    rows = []
    for agent in agents:
        task = agent if agent in set(part["task"]) else None
        if task is None:
            continue
        for variant in VARIANTS:
            sel = part[(part["variant"] == variant) & (part["task"] == task)]
            if variant != "base":
                sel = sel[sel["agent"] == agent]
            if len(sel):
                acc = float(sel["accuracy"].iloc[-1])
                n = sel["n"].iloc[-1] if "n" in sel.columns else None
                se = binomial_se(acc, int(n)) if n is not None and n == n else None
                rows.append({"agent": agent, "variant": variant, "task": task, "accuracy": acc,
                             "se": float("nan") if se is None else se})
    return pd.DataFrame(rows, columns=["agent", "variant", "task", "accuracy", "se"])

"""The exploration's CSV tables: rows replaced by key, and the markdown summary of mechanisms.csv."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..tasks import TASKS


def upsert(path: Path, new: pd.DataFrame, keys: list[str]) -> None:
    """Replace the rows of `path` whose keys appear in `new`, keep the others (order: old first)."""
    if path.is_file():
        old = pd.read_csv(path)
        merged_keys = new[keys].astype(str).agg("|".join, axis=1)
        old_keys = old[keys].astype(str).agg("|".join, axis=1)
        new = pd.concat([old[~old_keys.isin(set(merged_keys))], new], ignore_index=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    new.to_csv(path, index=False)


def markdown_table(df: pd.DataFrame) -> str:
    """One line per trio: per-agent density, unique share (chance), ρ and validation gain."""
    lines = ["| trio | mechanism | density c / t / m | unique share c / t / m (chance) | "
             "ρ c / t / m | val gain c / t / m |", "|---|---|---|---|---|---|"]
    for trio, g in df.groupby("trio", sort=False):
        g = g.set_index("agent").reindex(list(TASKS))
        dens = " / ".join(f"{100 * v:.1f}" for v in g["density"])
        uniq = " / ".join(f"{100 * u:.1f} ({100 * c:.1f})"
                          for u, c in zip(g["unique_share"], g["chance_unique_share"]))
        rho = " / ".join(f"{v:.2g}" for v in g["rho"])
        gain = " / ".join(f"{v:+.1f}" for v in g["val_gain"])
        lines.append(f"| {trio} | {g['mechanism'].iloc[0]} | {dens} | {uniq} | {rho} | {gain} |")
    return "\n".join(lines)

"""The Signal dilution page's toy: small sparse task vectors with a chosen overlap, and what each merge
keeps of every agent's unique updates (the maths of the page, kept out of the view)."""
from __future__ import annotations

import pandas as pd
import torch

from merging.methods import regions
from merging.methods.whole import merge_whole

ROWS, COLS = 8, 16  # 128 toy parameters per agent
TOY_EPS = 1e-6


def toy_taus(densities: list[float], overlaps: list[float], seed: int) -> torch.Tensor:
    """N sparse task vectors: a share `overlaps[t]` of agent t's changes sits in one common region."""
    g = torch.Generator().manual_seed(seed)
    n, e = len(densities), ROWS * COLS
    perm = torch.randperm(e, generator=g)
    counts = [max(1, round(d * e)) for d in densities]
    shared_n = [round(o * c) for o, c in zip(overlaps, counts)]
    pool = perm[: max(shared_n + [0])]
    rest = perm[len(pool):]
    private = torch.tensor_split(rest, n)  # always n (possibly empty) disjoint regions
    taus = torch.zeros(n, e)
    for t in range(n):
        own = torch.cat([pool[: shared_n[t]], private[t][: counts[t] - shared_n[t]]])
        mag = 0.5 + torch.rand(len(own), generator=g)
        sign = torch.where(torch.rand(len(own), generator=g) < 0.8, 1.0, -1.0)  # mostly agreeing signs
        taus[t, own] = mag * sign
    return taus


def toy_merges(taus: torch.Tensor, r: float, alpha: float) -> dict[str, torch.Tensor]:
    """The toy's task vectors merged by averaging, RAM and RAM+ (global ρ, the Tune page's r and α): what the
    Signal dilution page draws side by side (the methods' own functions, on the whole toy at once)."""
    ram_plus = {"eps": TOY_EPS, "r": r, "alpha": alpha, "rho_scope": "global"}
    return {"average": merge_whole("average", taus),
            "RAM": merge_whole("ram", taus, {"eps": TOY_EPS}),
            "RAM+": merge_whole("ram_plus", taus, ram_plus)}


def unique_retention(taus: torch.Tensor, merged: dict[str, torch.Tensor], names: list[str]) -> pd.DataFrame:
    """Per agent and method: mean |τ_m| / mean |τ_t| over the agent's unique elements."""
    active, count = regions.masks(taus, TOY_EPS)  # m_t and c of Eq. 1, from the core
    only = active & (count == 1)
    rows = []
    for t, name in enumerate(names):
        mask = only[t]
        own = float(taus[t, mask].abs().mean()) if mask.any() else 0.0
        for method, tm in merged.items():
            kept = float(tm[mask].abs().mean()) / own if own else 0.0
            rows.append({"agent": name, "method": method, "retention": kept, "unique_elements": int(mask.sum())})
    return pd.DataFrame(rows)


def toy_rho_lambda(taus: torch.Tensor, names: list[str], r: float, alpha: float, rule: str = "clip") -> pd.DataFrame:
    """The toy's ρ_t and λ_t (Eq. 2, 6/8) from its own counts: what RAM+ multiplies each unique update by."""
    counts = regions.counts(taus, TOY_EPS)
    rows = []
    for name, (shared, unique) in zip(names, counts.tolist()):
        changed = shared + unique
        rows.append({"agent": name, "changed": changed, "shared": shared, "unique": unique,
                     "unique_share": unique / changed if changed else 0.0,
                     "rho": regions.rho(shared, unique),
                     "lambda": regions.lambda_for(shared, unique, r, alpha, rule)})
    out = pd.DataFrame(rows)
    out["chance_unique_share"] = regions.chance_unique_share([c / (ROWS * COLS) for c in out["changed"]])
    return out

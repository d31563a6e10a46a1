"""What an agent that may not descend from the base (a lineage warning, merging/reading/lineage.py) does to the
other agents' statistics, in sentences for the analysis reading.

A dense agent changes almost every element, so nearly everything any other agent changed counts as "shared"
with it: their unique shares collapse and their ρ_t = shared/unique explodes. The exact effect is measured from
the pass's pair sums: the share of each other agent's changed elements that the flagged agent also changed, and
— when one other agent is left besides — that agent's unique share without the flagged one (with more agents,
the interval the pair sums bound it to).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analysis.stats import AnalysisResult


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def _both(pairs, a: str, b: str) -> int:
    rows = pairs[((pairs["a"] == a) & (pairs["b"] == b)) | ((pairs["a"] == b) & (pairs["b"] == a))]
    return int(rows["both_changed"].sum())


def lineage_sentences(result: AnalysisResult, eps: float) -> list[str]:
    """One sentence per flagged agent: its density, and how much of each other agent's 'shared' region is overlap
    with it (and their unique share without it)."""
    flagged = list(dict.fromkeys(w["agent"] for w in result.lineage if w.get("agent") in result.agents))
    if not flagged:
        return []
    frame = result.frame[result.frame["eps"] == eps]
    pairs = result.pairs[result.pairs["eps"] == eps] if not result.pairs.empty else result.pairs
    by_agent = frame.groupby("agent")[["changed", "shared", "unique", "numel"]].sum()
    out = []
    for x in flagged:
        others = [a for a in result.agents if a != x]
        density = by_agent.loc[x, "changed"] / by_agent.loc[x, "numel"] if by_agent.loc[x, "numel"] else 0.0
        parts = []
        for a in others:
            changed = int(by_agent.loc[a, "changed"])
            if not changed or pairs.empty:
                continue
            with_x = _both(pairs, a, x) / changed
            rest = [b for b in others if b != a]
            unique_now = by_agent.loc[a, "unique"] / changed
            text = (f"{a}: {_pct(with_x)} of its changed elements are also changed by {x} "
                    f"(unique share {_pct(unique_now)}")
            if len(rest) == 1:
                text += f"; without {x}: {_pct(1 - _both(pairs, a, rest[0]) / changed)})"
            elif rest:
                sums = [_both(pairs, a, b) for b in rest]
                low = max(0.0, 1 - min(sum(sums), changed) / changed)
                high = 1 - max(sums) / changed
                text += f"; without {x}: between {_pct(low)} and {_pct(high)})"
            else:
                text += ")"
            parts.append(text)
        out.append(f"Agent {x} may not be a fine-tune of this base (see its warning): it changed {_pct(density)} of "
                   f"the weights at ε = {eps:g}, so the others' shared regions and ρ_t are mostly overlap with it — "
                   + ("; ".join(parts) if parts else "no other agent changed anything")
                   + f". Read the others' statistics from an analysis without {x}.")
    return out

"""How much of each agent's unique update Fisher merging keeps: the effective scale F'_t / Σ_i F'_i (F' = F + floor)
that multiplies τ_t where only agent t changed the element (the RAM paper's App. D argument: the inactive agents'
Fisher still enters the denominator), measured over the whole model next to the same scale on the shared elements.

Regions are the merge's own rule (merging.methods.regions: changed when |τ| > ε, unique when one agent changed
the element, shared when several did). One pass over the weights and the Fisher files, chunk by chunk.
"""
from __future__ import annotations

import pandas as pd
import torch

from merging.methods.regions import changed, f32
from merging.passes import float_chunks
from merging.reading.checkpoint import Checkpoint
from merging.reading.chunks import ChunkReader

BINS = 2000  # histogram of the scale on [0, 1]: quantiles to 1/2000


def effective_scales(base: Checkpoint, agents: list[Checkpoint], fishers: list[Checkpoint], *, eps: float = 1e-5,
                     floor: float = 1e-6) -> pd.DataFrame:
    """Per agent and region (unique, shared): elements, the scale's mean, quantiles (10 %, 50 %, 90 %), the share
    of elements below 1/N (scaled down more than plain averaging would), and the share of the region's update
    (Σ|τ_t|) the merge keeps at λ = 1 (Σ scale·|τ_t| / Σ|τ_t|)."""
    n = len(agents)
    hist = torch.zeros((2, n, BINS), dtype=torch.float64)
    sums = torch.zeros((2, n, 5), dtype=torch.float64)  # elements, Σ scale, elements below 1/N, Σ|τ|, Σ scale·|τ|
    side = ChunkReader(fishers[0], fishers[1:])
    try:
        for data, chunk, _last, _fused in float_chunks(base, agents, phase="fisher scale", device=torch.device("cpu")):
            fdata = side.read(data.span)
            fisher = torch.stack([fdata.base, *fdata.agents]).reshape(n, -1).to(torch.float32) + f32(floor)
            fdata.release()
            taus = chunk.taus
            m = changed(taus, eps)
            count = m.sum(0)
            scale = fisher / fisher.sum(0)
            for region, where in enumerate((count == 1, count >= 2)):
                for t in range(n):
                    sel = m[t] & where
                    s, a = scale[t][sel].double(), taus[t][sel].abs().double()
                    hist[region, t] += torch.histc(s, BINS, 0.0, 1.0)
                    sums[region, t] += torch.stack([torch.tensor(float(s.numel()), dtype=torch.float64), s.sum(),
                                                    (s < 1.0 / n).sum().double(), a.sum(), (s * a).sum()])
    finally:
        side.close()
    return _rows(hist, sums, [a.label for a in agents])


def _rows(hist: torch.Tensor, sums: torch.Tensor, labels: list[str]) -> pd.DataFrame:
    """The table: exact counts, means and shares; quantiles from the histogram (to 1/BINS)."""
    nan = float("nan")
    rows = []
    for region, name in enumerate(("unique", "shared")):
        for t, label in enumerate(labels):
            count, total_s, below, mass, kept = sums[region, t].tolist()
            cdf = torch.cumsum(hist[region, t], 0) / max(count, 1.0)

            def q(p: float) -> float:
                i = int(torch.searchsorted(cdf, torch.tensor(p, dtype=torch.float64)))
                return (min(i, BINS - 1) + 0.5) / BINS if count else nan

            rows.append({"agent": label, "region": name, "elements": int(count),
                         "mean_scale": total_s / count if count else nan, "p10": q(0.1), "median": q(0.5),
                         "p90": q(0.9), "below_1_over_n": below / count if count else nan,
                         "update_kept": kept / mass if mass else nan})
    return pd.DataFrame(rows)

"""Paper-like overlap structure of three RL task vectors and cheap per-element sampling of it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.paper import PAPER_AGENTS

AGENTS = ("agent_code", "agent_tool", "agent_memory")

# RAM paper, Sec. 3.1 (Qwen agents): density and unique fraction of the non-zero elements.
PAPER_DENSITY = tuple(PAPER_AGENTS[role]["density"] for role in ("code", "tool", "memory"))
PAPER_UNIQUE_FRACTION = tuple(PAPER_AGENTS[role]["unique"] for role in ("code", "tool", "memory"))

# Region order on the unit interval: code's and memory's masks are one interval each, tool's two.
REGIONS = ("C", "CT", "CTM", "CM", "M", "TM", "T", "none")
U16 = 65536


@dataclass(frozen=True)
class OverlapModel:
    """Probabilities of the 8 membership regions, stored as uint16 thresholds on [0, 65536)."""

    probs: dict[str, float]
    bounds: tuple[int, ...]  # cumulative upper bounds of REGIONS[:-1], in units of 1/65536

    @classmethod
    def paper_like(cls, code_tool_only: float = 0.002) -> "OverlapModel":
        """Solve region probabilities that give the paper's densities and unique fractions."""
        d, f = PAPER_DENSITY, PAPER_UNIQUE_FRACTION
        uniq = [d[i] * f[i] for i in range(3)]
        shared = [d[i] - uniq[i] for i in range(3)]
        p_ct = code_tool_only
        p_cm = p_ct + shared[2] - shared[1]
        p_ctm = shared[0] - p_ct - p_cm
        p_tm = shared[1] - p_ct - p_ctm
        probs = {"C": uniq[0], "CT": p_ct, "CTM": p_ctm, "CM": p_cm, "M": uniq[2],
                 "TM": p_tm, "T": uniq[1]}
        if min(probs.values()) < 0:
            raise ValueError(f"infeasible overlap model: {probs}")
        probs["none"] = 1.0 - sum(probs.values())
        cum, bounds = 0.0, []
        for r in REGIONS[:-1]:
            cum += probs[r]
            bounds.append(round(cum * U16))
        return cls(probs, tuple(bounds))

    def masks(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Boolean masks (code, tool, memory) for uniform uint16 draws r."""
        b = self.bounds  # ends of C, CT, CTM, CM, M, TM, T
        code = r < b[3]
        tool = ((r >= b[0]) & (r < b[2])) | ((r >= b[4]) & (r < b[6]))
        memory = (r >= b[1]) & (r < b[5])
        return code, tool, memory

    def expected(self) -> dict[str, dict[str, float]]:
        """Expected density and unique fraction per agent under this model."""
        out = {}
        for letter, agent in zip("CTM", AGENTS):
            dens = sum(p for r, p in self.probs.items() if letter in r)
            out[agent] = {"density": dens, "unique_fraction": self.probs[letter] / dens}
        return out

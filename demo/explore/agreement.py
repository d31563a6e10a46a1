"""Is the overlap real? A brute-force yardstick from the safetensors files: per pair of agents, on the elements
both changed, the share with the same sign and the cosine of their updates."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def _task_vectors(base: Path, agents: dict[str, Path]) -> dict[str, np.ndarray]:
    """Each agent's whole task vector τ = θ_agent − θ_base, float32 from the stored values, one
    flat array (tensors in name order)."""
    from safetensors.torch import load_file
    theta0 = load_file(str(base / "model.safetensors"))
    names = sorted(theta0)
    out = {}
    for agent, folder in agents.items():
        theta = load_file(str(folder / "model.safetensors"))
        out[agent] = np.concatenate([(theta[n].float() - theta0[n].float()).numpy().ravel()
                                     for n in names])
    return out


def pair_agreement(base: Path, agents: dict[str, Path], eps: float = 1e-5) -> pd.DataFrame:
    """Is the overlap real? For each pair of agents, on the elements both changed (|τ| > ε): how
    many, the share with the same sign (chance 50 %), and the cosine of their τ there (chance 0);
    a last row ("all") gives the share where every agent changed the element and all signs agree
    (chance 2^(1−N)). A brute-force exploration yardstick computed from the safetensors files."""
    tau = _task_vectors(base, agents)
    names = list(agents)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            both = (np.abs(tau[a]) > eps) & (np.abs(tau[b]) > eps)
            x, y = tau[a][both].astype(np.float64), tau[b][both].astype(np.float64)
            rows.append({"a": a, "b": b, "eps": eps, "both_changed": int(both.sum()),
                         "sign_agreement": float(np.mean(np.sign(x) == np.sign(y))) if both.any() else float("nan"),
                         "cosine": float(x @ y / np.sqrt((x @ x) * (y @ y))) if both.any() else float("nan"),
                         "cosine_whole": float(tau[a].astype(np.float64) @ tau[b] /
                                               np.sqrt((tau[a].astype(np.float64) ** 2).sum() *
                                                       (tau[b].astype(np.float64) ** 2).sum()))})
    every = np.all([np.abs(t) > eps for t in tau.values()], axis=0)
    signs = np.stack([np.sign(t[every]) for t in tau.values()])
    rows.append({"a": "all", "b": "all", "eps": eps, "both_changed": int(every.sum()),
                 "sign_agreement": float(np.mean(np.all(signs == signs[:1], axis=0))) if every.any() else float("nan"),
                 "cosine": float("nan"), "cosine_whole": float("nan")})
    return pd.DataFrame(rows)

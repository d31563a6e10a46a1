"""Measure the demo agents' task vectors: density at ε and the overlap structure across agents."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd
import torch
from safetensors.torch import load_file

from analysis.paper import PAPER_AGENTS


def load_state(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder, upcast to float32 (bf16 values are exact in fp32)."""
    return {k: v.float() for k, v in load_file(str(Path(folder) / "model.safetensors")).items()}


def change_masks(base: dict[str, torch.Tensor], agent: dict[str, torch.Tensor], eps: float
                 ) -> dict[str, torch.Tensor]:
    """Per-tensor boolean masks |θ_agent − θ_base| > ε."""
    return {k: (agent[k] - base[k]).abs() > eps for k in base}


def analyze(base_dir: Path, agent_dirs: dict[str, Path], eps: float = 1e-5) -> pd.DataFrame:
    """Per agent: changed/total, density, and the fraction of its changed elements changed by
    exactly 1, 2, 3 agents (1 = unique), with the paper's numbers alongside for comparison."""
    base = load_state(base_dir)
    masks = {name: change_masks(base, load_state(d), eps) for name, d in agent_dirs.items()}
    total = sum(t.numel() for t in base.values())
    counts = {k: sum(m[k].to(torch.int8) for m in masks.values()) for k in base}
    rows = []
    for name, mask in masks.items():
        changed = sum(int(mask[k].sum()) for k in base)
        row = {"agent": name, "eps": eps, "params": total, "changed": changed,
               "density": changed / total}
        for c in range(1, len(agent_dirs) + 1):
            n = sum(int((mask[k] & (counts[k] == c)).sum()) for k in base)
            row[f"frac_overlap_{c}"] = n / changed if changed else 0.0
        shared = changed - round(row["frac_overlap_1"] * changed)
        unique = changed - shared
        row["rho"] = shared / unique if unique else float("inf")
        row["paper_density"] = PAPER_AGENTS.get(name, {}).get("density")
        row["paper_unique_fraction"] = PAPER_AGENTS.get(name, {}).get("unique")
        rows.append(row)
    return pd.DataFrame(rows)


def per_tensor_density(base_dir: Path, agent_dir: Path, eps: float = 1e-5) -> pd.DataFrame:
    """Density per tensor for one agent (shows where RL moved weights)."""
    base, agent = load_state(base_dir), load_state(agent_dir)
    rows = []
    for k in sorted(base):
        diff = (agent[k] - base[k]).abs()
        rows.append({"tensor": k, "numel": diff.numel(), "density": float((diff > eps).float().mean()),
                     "max_abs": float(diff.max()), "mean_abs_base": float(base[k].abs().mean())})
    return pd.DataFrame(rows)


def eps_ladder(base_dir: Path, agent_dirs: dict[str, Path],
               eps_values: Sequence[float] = (0.0, 1e-6, 1e-5, 1e-4, 1e-3)) -> pd.DataFrame:
    """Densities over several thresholds (how sensitive the sparsity picture is to ε)."""
    return pd.concat([analyze(base_dir, agent_dirs, e) for e in eps_values], ignore_index=True)

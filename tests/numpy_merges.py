"""Independent numpy statements of task arithmetic, TIES and RAM+ (merging-methods reference), for checking whole
merges of real checkpoints: every tensor of base and agents as float32 arrays in, the merged model's tensors out
(bf16 rounding by bit arithmetic, round-to-nearest-even, as a cast does)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def read_folder(folder: Path) -> dict[str, tuple[np.ndarray, str]]:
    """Every tensor of a folder as (float32 array, stored dtype name); only for tiny test models."""
    from safetensors import safe_open

    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                t = h.get_tensor(name)
                out[name] = (t.float().numpy() if t.is_floating_point() else t.numpy(), str(t.dtype))
    return out


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bit patterns (uint16), rounding to nearest even (finite inputs)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def task_arithmetic(base: np.ndarray, agents: list[np.ndarray], lam: float) -> np.ndarray:
    """θ0 + λ·Σ_t τ_t in float32 (τ summed in agent order)."""
    total = np.zeros_like(base)
    for a in agents:
        total = total + (a - base)
    return base + total * np.float32(lam)


def ties(base: np.ndarray, agents: list[np.ndarray], density: float, lam: float) -> np.ndarray:
    """Per tensor: keep each τ_t's k = int(density·n) largest |τ| (ties: lowest flat index first), elect the sign
    of Σ (a zero sum elects +), the mean of the τ that agree with it (0 if none), × λ."""
    flat = base.reshape(-1)
    n = flat.size
    k = int(density * n)
    trimmed = []
    for a in agents:
        tau = a.reshape(-1) - flat
        keep = np.zeros(n, dtype=bool)
        if k >= n:
            keep[:] = True
        elif k > 0:
            order = np.lexsort((np.arange(n), -np.abs(tau)))  # largest |τ| first, then the lower index
            keep[order[:k]] = True
        trimmed.append(np.where(keep, tau, np.float32(0)))
    t = np.stack(trimmed)
    total = np.zeros(n, dtype=np.float32)
    for row in t:
        total = total + row
    elected = np.where(total >= 0, np.float32(1), np.float32(-1))
    agree = (np.sign(t) == elected) & (t != 0)
    count = agree.sum(0)
    s = np.zeros(n, dtype=np.float32)
    for row, ok in zip(t, agree):
        s = s + np.where(ok, row, np.float32(0))
    mean = np.where(count > 0, s / np.maximum(count, 1).astype(np.float32), np.float32(0))
    return (flat + mean * np.float32(lam)).reshape(base.shape)


def ram_plus_lambdas(pairs: list[tuple[np.ndarray, list[np.ndarray]]], eps: float, r: float,
                     alpha: float) -> list[float]:
    """λ_t = 1 + r·clip(ρ_t, 0, α), ρ_t = shared_t / unique_t counted over every float tensor (|τ| > ε in float32)."""
    e = np.float32(eps)
    shared = np.zeros(len(pairs[0][1]), dtype=np.int64)
    unique = np.zeros_like(shared)
    for base, agents in pairs:
        m = np.stack([np.abs(a - base) > e for a in agents])
        c = m.sum(0)
        shared += (m & (c >= 2)).reshape(len(agents), -1).sum(1)
        unique += (m & (c == 1)).reshape(len(agents), -1).sum(1)
    out = []
    for s, u in zip(shared, unique):
        rho = s / u if u else (np.inf if s else 0.0)
        out.append(1.0 if s + u == 0 else 1.0 + r * min(max(rho, 0.0), alpha))
    return out


def ram_plus(base: np.ndarray, agents: list[np.ndarray], eps: float, lambdas: list[float]) -> np.ndarray:
    """Eq. 7: 0 where no agent changed an element, λ_t·τ_t where only t did, the mean of the active τ where
    several did."""
    e = np.float32(eps)
    taus = [a - base for a in agents]
    m = [np.abs(t) > e for t in taus]
    c = np.sum(m, axis=0)
    total = np.zeros_like(base)
    scaled = np.zeros_like(base)
    for t, mk, lam in zip(taus, m, lambdas):
        masked = np.where(mk, t, np.float32(0))
        total = total + masked
        scaled = scaled + masked * np.float32(lam)
    merged = np.where(c >= 2, total / np.maximum(c, 1).astype(np.float32), scaled)
    return base + merged


def expected_merge(base: Path, agents: list[Path], method: str, params: dict) -> dict[str, np.ndarray]:
    """The merged model's tensors as stored (bf16 as uint16 bit patterns, float32 as float32, others as they
    are), computed from the folders (agents in the base's layout)."""
    b = read_folder(base)
    ags = [read_folder(a) for a in agents]
    floats = [n for n, (_v, d) in b.items() if d in ("torch.bfloat16", "torch.float32", "torch.float16")]
    lambdas = None
    if method == "ram_plus":
        lambdas = ram_plus_lambdas([(b[n][0], [a[n][0] for a in ags]) for n in floats], params["eps"],
                                   params["r"], params["alpha"])
    out = {}
    for name, (value, dtype) in b.items():
        if name not in floats:
            out[name] = value
            continue
        others = [a[name][0] for a in ags]
        if method == "task_arithmetic":
            merged = task_arithmetic(value, others, params["lambda"])
        elif method == "ties":
            merged = ties(value, others, params["density"], params["lambda"])
        else:
            merged = ram_plus(value, others, params["eps"], lambdas)
        out[name] = to_bf16_bits(merged) if dtype == "torch.bfloat16" else merged.astype(np.float32)
    return out


def stored(folder: Path) -> dict[str, np.ndarray]:
    """A folder's tensors as stored: bf16 as uint16 bit patterns, others as numpy arrays."""
    import torch
    from safetensors import safe_open

    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                t = h.get_tensor(name)
                out[name] = t.view(torch.uint16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
    return out

"""An independent reference of the RAM authors' public script (xiangchi-yuan/mrl, `ram-main.py`), modes `arm-r-v2`
and `arm-r`, written from its rules (not its code), and the comparison of our presets against it.

The rules: every model is loaded whole with transformers in float32 and its `state_dict()` taken (so a tied
embedding is listed twice, once more as `lm_head.weight`); over the keys all models share, τ = θ_t − θ_0 in
float32, m_t = |τ_t| > ε, c = Σ_t m_t; changed_t = Σ m_t, overlap_t = Σ m_t ∧ (c ≥ 2) over every key. λ_t in
float64: `arm-r-v2` 1 + (R − 1)·min(2, min(1, overlap/(changed − overlap))), `arm-r` 1 + (R − 1)·max(0, min(1,
overlap/changed)), a ratio of 0 when changed = 0, R below 1 taken as 1; `arm-r-v2` divides by zero when an agent
changed elements but has none of its own. Per element: the mean of the active τ where c ≥ 2, λ_t·τ_t (λ_t in
float32) where c = 1, 0 where c = 0, added to θ_0 in float32; written in float32.

`python -m tests.merging.authors_script [--code DIR]` merges both bundled trios with the authors' presets through
the CLI of the source tree DIR (default: this one) and prints, per case, the λ_t recorded in ram_recipe.json
beside the script's and the number of output elements that differ from the script's tensors.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
MODES = {"arm-r-v2": "authors-default", "arm-r": "authors-soft"}
# (mode, R, ε): the cases the presets must reproduce on both bundled trios.
CASES = (("arm-r", 1.05, 1e-5), ("arm-r", 1.2, 1e-5), ("arm-r-v2", 1.2, 1e-3))
TRIOS = {"demo": ROOT / "assets" / "demo" / "models", "demo-shared": ROOT / "assets" / "demo" / "models-shared"}


def load_like_script(folder: Path) -> dict[str, torch.Tensor]:
    """The model as the script holds it: loaded by transformers in float32, then its `state_dict()`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, trust_remote_code=False)
    out = {k: v.detach().clone() for k, v in model.state_dict().items()}
    del model
    return out


def task_vectors(base: dict[str, torch.Tensor], agents: list[dict[str, torch.Tensor]]
                 ) -> tuple[list[str], list[dict[str, torch.Tensor]]]:
    """The keys every model lists (sorted) and each agent's τ = θ_t − θ_0 on them, in float32."""
    keys = set(base)
    for a in agents:
        keys &= set(a)
    names = sorted(keys)
    return names, [{k: a[k] - base[k] for k in names} for a in agents]


def counts(names: list[str], taus: list[dict[str, torch.Tensor]], eps: float) -> tuple[list[int], list[int]]:
    """changed_t and overlap_t (changed elements some other agent changed too) over every listed key."""
    n = len(taus)
    changed, overlap = [0] * n, [0] * n
    for k in names:
        m = torch.stack([t[k] for t in taus]).abs() > eps
        c = m.sum(0)
        for j in range(n):
            changed[j] += int(m[j].sum())
            overlap[j] += int((m[j] & (c >= 2)).sum())
    return changed, overlap


def rescales(mode: str, changed: list[int], overlap: list[int], R: float) -> list[float | None]:
    """λ_t of each agent in float64 as the script prints it; None where `arm-r-v2` divides by zero."""
    R = max(float(R), 1.0)
    out: list[float | None] = []
    for ch, ov in zip(changed, overlap):
        if ch == 0:
            ratio = 0.0
        elif mode == "arm-r":
            ratio = ov / ch
        elif ch == ov:
            out.append(None)
            continue
        else:
            ratio = ov / (ch - ov)
        bounded = min(2, min(1.0, ratio)) if mode == "arm-r-v2" else max(0.0, min(1.0, ratio))
        out.append(1.0 + (R - 1.0) * bounded)
    return out


def merge(base: dict[str, torch.Tensor], names: list[str], taus: list[dict[str, torch.Tensor]], eps: float,
          lam: list[float]) -> dict[str, torch.Tensor]:
    """θ_0 + τ_m per key: mean of the active τ where ≥ 2 agents changed an element, λ_t·τ_t where one did."""
    merged = {}
    for k in names:
        d = torch.stack([t[k] for t in taus])
        mask = (d.abs() > eps).float()
        c = mask.sum(0)
        mean = (d * mask).sum(0) / c.clamp(min=1.0)
        scale = torch.tensor(lam, dtype=d.dtype).view(-1, *[1] * (d.dim() - 1))
        single = (d * mask * scale).sum(0)
        merged[k] = base[k] + torch.where(c >= 2, mean, torch.where(c == 1, single, torch.zeros_like(mean)))
    for k, v in base.items():
        merged.setdefault(k, v.clone())
    return merged


@dataclass
class ScriptRun:
    """What the script prints and writes for one mode, R and ε."""

    changed: list[int]
    overlap: list[int]
    lambdas: list[float | None]
    merged: dict[str, torch.Tensor]


def run_script_rules(base_dir: Path, agent_dirs: list[Path], mode: str, R: float, eps: float,
                     loaded: tuple | None = None) -> ScriptRun:
    """The script's counts, λ_t and merged tensors for these models (`loaded`: the state dicts, if already held)."""
    base, agents = loaded or (load_like_script(base_dir), [load_like_script(a) for a in agent_dirs])
    names, taus = task_vectors(base, agents)
    changed, overlap = counts(names, taus, eps)
    lam = rescales(mode, changed, overlap, R)
    usable = [max(float(R), 1.0) if v is None else v for v in lam]  # where the script stops, our limit
    return ScriptRun(changed, overlap, lam, merge(base, names, taus, eps, usable))


def differing_elements(out_dir: Path, merged: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(elements of the written tensors that differ from the script's, elements written); every written tensor
    must be one the script's state_dict() lists, with its shape."""
    from tests.factory import state

    differ = total = 0
    for k, v in state(out_dir).items():
        ref = merged[k]
        assert v.shape == ref.shape and v.dtype == torch.float32, (k, v.shape, v.dtype)
        differ += int((v.view(torch.int32) != ref.view(torch.int32)).sum())
        total += v.numel()
    return differ, total


def _merge_with_cli(code: Path, trio: str, mode: str, R: float, eps: float, out: Path) -> dict:
    refs = [f"{trio}:{m}" for m in ("base", "code", "tool", "memory")]
    cmd = [sys.executable, "-m", "ram_studio", "merge", *refs, "--preset", MODES[mode], "--rescale-factor", str(R),
           "--eps", str(eps), "--out", str(out), "--out-dtype", "float32", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(code), "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run(cmd, cwd=code, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "ram_recipe.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, default=ROOT, help="the RAM Studio source tree whose CLI merges")
    args = parser.parse_args(argv)
    print("| trio | mode | preset | R | ε | script λ_t | recipe λ_t | max |Δλ| | differing elements |")
    print("|---|---|---|---|---|---|---|---|---|")
    for trio, folder in TRIOS.items():
        dirs = [folder / m for m in ("base", "code", "tool", "memory")]
        loaded = (load_like_script(dirs[0]), [load_like_script(d) for d in dirs[1:]])
        for mode, R, eps in CASES:
            ref = run_script_rules(dirs[0], dirs[1:], mode, R, eps, loaded)
            with tempfile.TemporaryDirectory() as tmp:
                recipe = _merge_with_cli(args.code.resolve(), trio, mode, R, eps, Path(tmp) / "merged")
                differ, total = differing_elements(Path(tmp) / "merged", ref.merged)
            ours = [row["lambda"] for row in recipe["lambdas"]]
            gap = max(abs(a - b) for a, b in zip(ours, ref.lambdas) if b is not None)
            show = lambda v: " / ".join("÷0" if x is None else f"{x:.6f}" for x in v)  # noqa: E731
            print(f"| {trio} | {mode} | {MODES[mode]} | {R:g} | {eps:g} | {show(ref.lambdas)} | {show(ours)} | "
                  f"{gap:.1e} | {differ:,} of {total:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

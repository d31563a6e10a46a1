"""Fisher merging against an independent computation (numpy, the paper's formula) on tiny real checkpoints in bf16
and fp32 with their Fisher side files; the streaming engine equals the in-memory merge bit for bit at two chunk
sizes; the floor and the all-zero fallback; side files that do not fit the merge are refused in one line."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from merging.common.errors import RamStudioError
from merging.engine.tensor_merge import merge_in_memory
from merging.merge import merge_to_folder
from merging.reading.checkpoint import open_checkpoint
from merging.reading.side_tensors import SideTensors
from merging.recipe import MergeSpec
from tests.factory import make_agent, make_base, state


def family(root: Path, dtype) -> tuple[Path, list[Path]]:
    base = make_base(root / "base", dtype=dtype, shard=None)
    return base, [make_agent(base, root / f"agent{i}", d, seed=10 + i) for i, d in enumerate((0.1, 0.4, 0.5))]


def fisher_files(root: Path, base: Path, n_agents: int, seed: int = 0) -> list[Path]:
    """Random Fishers ≥ 0 (a third of the elements exactly 0 for each agent, some 0 for all of them)."""
    g = torch.Generator().manual_seed(seed)
    tensors = {k: v for k, v in state(base).items() if v.is_floating_point()}
    all_zero = {k: torch.rand(v.numel(), generator=g) < 0.1 for k, v in tensors.items()}
    paths = []
    for i in range(n_agents):
        out = {}
        for k, v in tensors.items():
            f = torch.rand(v.numel(), generator=g) * 10.0 ** torch.randint(-6, 1, (v.numel(),), generator=g)
            f[(torch.rand(v.numel(), generator=g) < 0.33) | all_zero[k]] = 0.0
            out[k] = f.view(v.shape).to(torch.float32)
        paths.append(root / f"fisher{i}.safetensors")
        save_file(out, paths[-1])
    return paths


def side_of(files: list[Path], agents: list[Path]) -> SideTensors:
    from evaluation.fisher import agent_prints

    return SideTensors("fisher", tuple(files), {"test": True}, (),
                       tuple(agent_prints([open_checkpoint(a) for a in agents])))


def numpy_fisher(base: np.ndarray, agents: list[np.ndarray], fishers: list[np.ndarray], lam: float,
                 floor: float) -> np.ndarray:
    """θ0 + λ·Σ F'τ / Σ F' in float32, F' = F + floor, the mean where Σ F' = 0 (numpy, agent by agent)."""
    f32 = np.float32
    taus = [a.astype(f32) - base.astype(f32) for a in agents]
    num = np.zeros_like(taus[0])
    den = np.zeros_like(taus[0])
    tot = np.zeros_like(taus[0])
    for t, f in zip(taus, fishers):
        w = f.astype(f32) + f32(floor)
        num += w * t
        den += w
        tot += t
    with np.errstate(invalid="ignore", divide="ignore"):
        merged = np.where(den > 0, num / np.where(den > 0, den, f32(1)), tot * f32(1 / len(taus)))
    return base.astype(f32) + merged * f32(lam)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("floor", [0.0, 1e-6])
def test_merge_equals_numpy_and_streaming_equals_in_memory(tmp_path, dtype, floor):
    base, agents = family(tmp_path, dtype)
    files = fisher_files(tmp_path, base, 3)
    side = side_of(files, agents)
    params = {"lambda": 0.7, "fisher_floor": floor}
    outs = []
    for chunk in (1 << 23, 96):  # one chunk per tensor, and many chunks per tensor
        spec = MergeSpec(str(base), [str(a) for a in agents], "fisher", params, str(tmp_path / f"out{chunk}"),
                         chunk_elems=chunk, device="cpu")
        merge_to_folder(spec, side=side)
        outs.append(state(tmp_path / f"out{chunk}"))
    assert outs[0].keys() == outs[1].keys()
    assert all(torch.equal(outs[0][k].view(torch.uint8) if outs[0][k].dtype == torch.bfloat16 else outs[0][k],
                            outs[1][k].view(torch.uint8) if outs[1][k].dtype == torch.bfloat16 else outs[1][k])
               for k in outs[0])
    b, ag = state(base), [state(a) for a in agents]
    fs = [load_file(f) for f in files]
    for k, out in outs[0].items():
        assert out.dtype == dtype  # the base's dtype
        expected = numpy_fisher(b[k].float().numpy(), [a[k].float().numpy() for a in ag], [f[k].numpy() for f in fs],
                                0.7, floor)
        got = torch.from_numpy(expected).to(dtype)
        assert torch.equal(out, got), k  # float32 bits equal, then the same rounding to the output dtype
        taus = torch.stack([a[k].float() - b[k].float() for a in ag])
        mem = merge_in_memory("fisher", taus, params, side=torch.stack([f[k] for f in fs]), base=b[k].float(),
                              chunk_elems=7)
        assert torch.equal(mem.to(dtype), out), k


def test_zero_fisher_everywhere_is_the_mean_and_a_floor_is_a_weight():
    taus = torch.tensor([[1.0, 2.0, 0.5], [3.0, 0.0, 0.5]])
    zero = torch.zeros_like(taus)
    for floor in (0.0, 1e-6, 5.0):  # all F = 0: every agent weighs the same (the floor, or 0/0 → the mean)
        out = merge_in_memory("fisher", taus, {"fisher_floor": floor}, side=zero)
        assert torch.allclose(out, taus.mean(0), rtol=1e-6), floor
    fisher = torch.tensor([[3.0, 0.0, 1.0], [1.0, 2.0, 0.0]])
    exact = merge_in_memory("fisher", taus, {"fisher_floor": 0.0, "lambda": 0.5}, side=fisher)
    assert exact.tolist() == [0.75, 0.0, 0.25]  # (3·1 + 1·3)/4 · 0.5, (0·2 + 2·0)/2 · 0.5, (1·.5 + 0)/1 · 0.5
    # App. D: a unique update (only agent 0 changed it) is scaled by F_0 / ΣF, not kept whole
    unique = merge_in_memory("fisher", torch.tensor([[1.0], [0.0]]), {"fisher_floor": 0.0},
                             side=torch.tensor([[1.0], [3.0]]))
    assert unique.tolist() == [0.25]


def test_bad_fisher_values_and_missing_side_are_refused():
    taus = torch.ones(2, 4)
    for bad in (torch.tensor([[1.0, -1.0, 0, 0], [0, 0, 0, 0]]), torch.full((2, 4), float("nan"))):
        with pytest.raises(RamStudioError, match="negative, NaN or infinite"):
            merge_in_memory("fisher", taus, {}, side=bad)
    with pytest.raises(RamStudioError, match="needs each agent's Fisher"):
        merge_in_memory("fisher", taus, {})


def test_side_files_that_do_not_fit_the_merge_are_one_line(tmp_path):
    base, agents = family(tmp_path, torch.bfloat16)
    files = fisher_files(tmp_path, base, 3)
    refs = [str(a) for a in agents]

    def merge(side, method="fisher", out="o"):
        spec = MergeSpec(str(base), refs, method, {}, str(tmp_path / out), device="cpu")
        return merge_to_folder(spec, side=side)

    with pytest.raises(RamStudioError, match="needs each agent's fisher"):
        merge(None)
    with pytest.raises(RamStudioError, match="reads no fisher side tensors"):
        merge(side_of(files, agents), method="average")
    with pytest.raises(RamStudioError, match="2 fisher files for 3 agents"):
        merge(SideTensors("fisher", tuple(files[:2])))
    name = next(iter(state(base)))
    short = tmp_path / "short.safetensors"
    save_file({k: v for k, v in load_file(files[0]).items() if k != name}, short)
    with pytest.raises(RamStudioError, match=f"agent agent0 does not match the base at tensor '{name}'"):
        merge(SideTensors("fisher", (short, *files[1:])))
    with pytest.raises(RamStudioError, match="missing or not a regular file"):
        merge(SideTensors("fisher", (tmp_path / "nowhere.safetensors", *files[1:])))
    stale = SideTensors("fisher", tuple(files), {}, (), ("0" * 32, "1" * 32, "2" * 32))
    with pytest.raises(RamStudioError, match="agent agent0 changed since its fisher was computed"):
        merge(stale)
    assert not (tmp_path / "o").exists()  # nothing written by any of them


def test_no_mergekit_equivalent(tmp_path):
    from merging.interop.mergekit import to_mergekit_yaml

    text, note = to_mergekit_yaml(MergeSpec("b", ["a1", "a2"], "fisher", {}), {}, "BF16")
    assert text is None and "no equivalent of fisher" in note

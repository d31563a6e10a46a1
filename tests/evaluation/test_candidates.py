"""A sweep's in-memory candidates are bit for bit the models `ram-studio merge` writes: every method, resident
and streamed inputs, global ρ with counts from the analysis, DARE's masks, tied embeddings, sharded inputs."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from evaluation import candidates as cand
from evaluation.candidates import CandidateInputs
from merging.common.errors import RamStudioError
from merging.methods import METHODS
from ram_studio.cli import main
from ram_studio.commands.merge import param_flags
from tests.paths import REPO_ROOT

DEMO = REPO_ROOT / "assets" / "demo" / "models"
DEMO_REFS = [str(DEMO / "base")] + [str(DEMO / a) for a in ("code", "tool", "memory")]

CASES = [
    ("average", {}),
    ("task_arithmetic", {"lambda": 0.7}),
    ("ties", {"lambda": 1.0, "density": 0.2}),
    ("dare_ta", {"lambda": 1.0, "drop_rate": 0.3, "seed": 3}),
    ("dare_ties", {"lambda": 0.5, "drop_rate": 0.7}),
    ("ram", {"eps": 1e-5}),
    ("ram_plus", {"r": 0.1, "alpha": 2.0}),  # global ρ at the opening pass's ε
    ("ram_plus", {"r": 0.2, "eps": 1e-6}),  # global ρ at another ε: counts from the analysis (or a pass)
    ("ram_plus", {"r": 0.2, "rho_scope": "tensor"}),
    ("ram_plus_soft", {"r": 0.3}),
    ("unique_only", {"agent": "1", "dilute": True}),
    ("fisher", {"lambda": 0.9, "fisher_examples": 4, "fisher_rule": "greedy"}),  # each agent's Fisher, a sweep's way
]


def fisher_side(ins: CandidateInputs, module: torch.nn.Module, params: dict):
    """The side tensors a sweep worker gives a Fisher candidate (the pass runs in the worker's loaded model)."""
    from transformers import AutoTokenizer

    from demo.evaluator import DemoEvaluator
    from evaluation.base import LoadedModel
    from evaluation.fisher import SweepFishers

    loaded = LoadedModel(module, AutoTokenizer.from_pretrained(str(DEMO / "base"), trust_remote_code=False))
    return SweepFishers(DemoEvaluator(), ins, loaded, None, {}).side(params)[0]


def load(folder: Path) -> torch.nn.Module:
    """What an evaluator loads: transformers, float32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, use_safetensors=True,
                                                trust_remote_code=False).eval()


@pytest.fixture(scope="module")
def cli_demo(tmp_path_factory):
    """The CLI's merge of the demo for (method, params), made once per module (both input modes compare to it)."""
    root, made = tmp_path_factory.mktemp("cli"), {}

    def get(method: str, params: dict) -> Path:
        key = (method, repr(sorted(params.items())))
        if key not in made:
            made[key] = cli_merge(DEMO_REFS, root / f"m{len(made)}", method, params)
        return made[key]

    return get


def cli_merge(refs: list[str], out: Path, method: str, params: dict) -> Path:
    flags = param_flags(params)
    assert main(["merge", *refs, "--method", method, "--out", str(out), "--quiet", *flags]) == 0
    return out


def assert_same(module: torch.nn.Module, folder: Path) -> None:
    mine, ref = module.state_dict(), load(folder).state_dict()
    assert mine.keys() == ref.keys()
    differ = [k for k in ref if not torch.equal(mine[k], ref[k])]
    assert not differ, f"tensors differ from the CLI merge: {differ[:3]}"


def test_every_method_is_covered():
    assert {m for m, _ in CASES} == set(METHODS)


@pytest.mark.parametrize("mode", ["resident", "stream"])
def test_demo_candidates_equal_cli_merges(cli_demo, mode, monkeypatch, tmp_path_factory):
    # the cached analysis the CLI's merge uses (made for the first mode; the module's CLI merges are kept)
    monkeypatch.setenv("RAM_STUDIO_CACHE", str(tmp_path_factory.getbasetemp() / "sweep-merge-analysis"))
    assert main(["analyze", *DEMO_REFS, "--quiet"]) == 0
    passes = []
    real = cand.count_overlaps
    monkeypatch.setattr(cand, "count_overlaps", lambda *a, **k: passes.append(a[2]) or real(*a, **k))
    ins = CandidateInputs(DEMO_REFS[0], DEMO_REFS[1:], mode=mode)
    assert ins.resident == (mode == "resident")
    module = load(DEMO / "base")
    for method, params in CASES:
        side = fisher_side(ins, module, params) if method == "fisher" else None
        made = ins.merge_into(module, method, params, side=side)
        assert made.changed
        assert_same(module, cli_demo(method, params))
    assert passes == [1e-5], "global ρ at ε = 1e-6 must take the analysis's counts, not a counting pass"


def test_sharded_family_resident_and_streamed(family, tmp_path):
    base, agents = family
    refs = [str(base), *map(str, agents)]
    module = load(base)
    for mode in ("resident", "stream"):
        ins = CandidateInputs(refs[0], refs[1:], mode=mode, chunk_elems=1000)  # many chunks per tensor
        for i, (method, params) in enumerate([("ties", {"density": 0.3}), ("dare_ties", {"drop_rate": 0.5}),
                                              ("ram_plus", {"r": 0.5, "alpha": 1.0})]):
            ins.merge_into(module, method, params)
            assert_same(module, cli_merge(refs, tmp_path / f"{mode}{i}", method, params))


def test_resident_inputs_are_never_changed(tmp_path):
    """τ is never computed in place over resident data: the same candidate twice gives the same bits, also on
    the torch path (the GPU's), where a float32 staging buffer would otherwise be overwritten."""
    for widen in (False, True):
        ins = CandidateInputs(DEMO_REFS[0], DEMO_REFS[1:], mode="resident")
        if widen:  # float32 on the compute device, as on a GPU
            from merging.reading.resident import ResidentReader

            ins.reader = ResidentReader(ins.base, ins.agents, device=ins.device, widen=True)
        module = load(DEMO / "base")
        ins.merge_into(module, "ties", {"density": 0.3})
        first = {k: v.clone() for k, v in module.state_dict().items()}
        ins.merge_into(module, "task_arithmetic", {"lambda": 0.3})
        ins.merge_into(module, "ties", {"density": 0.3})
        assert all(torch.equal(first[k], v) for k, v in module.state_dict().items())


def test_gpu_style_torch_path_matches(cli_demo, monkeypatch):
    """The code a GPU runs (torch ops, float32 resident inputs, whole tensors assembled) on the CPU."""
    monkeypatch.setenv("RAM_STUDIO_KERNELS", "torch")
    monkeypatch.setenv("RAM_STUDIO_GPU_STYLE", "1")
    from merging.reading.resident import ResidentReader

    ins = CandidateInputs(DEMO_REFS[0], DEMO_REFS[1:], mode="resident")
    ins.reader = ResidentReader(ins.base, ins.agents, device=ins.device, widen=True)
    module = load(DEMO / "base")
    for method, params in [("ties", {"lambda": 1.0, "density": 0.2}),
                           ("dare_ta", {"lambda": 1.0, "drop_rate": 0.3, "seed": 3}),
                           ("ram_plus", {"r": 0.1, "alpha": 2.0})]:  # the same merges as above
        ins.merge_into(module, method, params)
        assert_same(module, cli_demo(method, params))


def test_a_non_finite_candidate_is_refused_like_a_merge(tmp_path):
    from tests.factory import make_agent, make_base

    base = make_base(tmp_path / "base", shard=None)
    agents = [make_agent(base, tmp_path / f"a{i}", 0.3, seed=i, scale=10.0) for i in range(2)]
    ins = CandidateInputs(str(base), [str(a) for a in agents], mode="resident")
    module = load(base)
    with pytest.raises(RamStudioError, match="not finite"):
        ins.merge_into(module, "task_arithmetic", {"lambda": 3e38})
    assert main(["merge", str(base), *map(str, agents), "--method", "task_arithmetic", "--lambda", "3e38",
                 "--out", str(tmp_path / "out"), "--quiet"]) == 2  # the CLI refuses it the same way


def test_inputs_a_merge_refuses_are_refused_once(tmp_path):
    import shutil

    base_copy = shutil.copytree(DEMO / "base", tmp_path / "base-copy")
    code_copy = shutil.copytree(DEMO / "code", tmp_path / "code-copy")
    with pytest.raises(RamStudioError, match="identical to the base"):
        CandidateInputs(DEMO_REFS[0], [str(base_copy), DEMO_REFS[1]], mode="resident")
    with pytest.raises(RamStudioError, match="same weights"):
        CandidateInputs(DEMO_REFS[0], [DEMO_REFS[1], str(code_copy)], mode="stream")
    with pytest.raises(RamStudioError, match="duplicate"):
        CandidateInputs(DEMO_REFS[0], [DEMO_REFS[1], DEMO_REFS[1]], mode="resident")

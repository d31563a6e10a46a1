"""The authors' presets reproduce the RAM authors' script bit for bit — λ_t and every written float32 — on tied and
untied models, judged by an independent reference of the script's two modes (tests/merging/authors_script.py)
that counts over the loaded model's `state_dict()` as the script does, tied alias included. Other settings keep
counting stored tensors once; `count_tied_twice` switches RAM+ and RAM+s to the script's convention."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from evaluation.candidates import CandidateInputs
from merging.engine.counts import count_overlaps, stored_tensor_weights
from merging.reading.checkpoint import open_checkpoint
from ram_studio.cli import main
from tests.factory import make_base, state, write_like
from tests.merging import authors_script as script

EMBED = "model.embed_tokens.weight"


def make_agent(base: Path, dst: Path, i: int) -> Path:
    """Agent i: a sparse update on every float tensor (density 8 %, 12 %, 20 %), and on the embedding a
    different pattern — agent 0 changes 70 % of the first half of its elements, the others only the second half —
    so that counting the embedding twice moves every λ_t."""
    g = torch.Generator().manual_seed(300 + i)
    out = {}
    for name, t in state(base).items():
        flat = t.float().reshape(-1).clone()
        mask = torch.rand(flat.numel(), generator=g) < (0.08, 0.12, 0.2)[i]
        if name == EMBED:
            first = torch.arange(flat.numel()) < flat.numel() // 2
            mask = (torch.rand(flat.numel(), generator=g) < 0.7) & first if i == 0 else mask & ~first
        flat[mask] += torch.randn(int(mask.sum()), generator=g) * 0.02
        out[name] = flat.view(t.shape).to(t.dtype)
    return write_like(base, dst, out)


@pytest.fixture(scope="module", params=["tied", "untied"])
def tiny(request, tmp_path_factory):
    """A tiny bf16 Qwen2 base (tied or untied embeddings), three agents, and the script's view of them."""
    root = tmp_path_factory.mktemp(request.param)
    base = make_base(root / "base", shard=None, tie=request.param == "tied")
    agents = [make_agent(base, root / f"agent{i}", i) for i in range(3)]
    loaded = (script.load_like_script(base), [script.load_like_script(a) for a in agents])
    return request.param, base, agents, loaded


def cli_merge(out: Path, base: Path, agents: list[Path], *flags: str) -> dict:
    assert main(["merge", str(base), *map(str, agents), "--out", str(out), "--out-dtype", "float32", "--quiet",
                 *flags]) == 0
    return json.loads((out / "ram_recipe.json").read_text())


@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_counts_over_state_dict(tiny, eps):
    """Counting with the base's tied aliases gives the script's counts over state_dict() exactly; counting stored
    tensors once differs from them exactly where a tied alias exists."""
    kind, base, agents, loaded = tiny
    names, taus = script.task_vectors(*loaded)
    changed, overlap = script.counts(names, taus, eps)
    assert "lm_head.weight" in names  # listed either way: a tied alias, or the stored head
    assert torch.equal(loaded[0]["lm_head.weight"], loaded[0][EMBED]) is (kind == "tied")
    b, ags = open_checkpoint(base), [open_checkpoint(a) for a in agents]
    weights = stored_tensor_weights(b, {"count_tied_twice": True})
    assert weights == ({EMBED: 2} if kind == "tied" else {})
    for w in (weights, None):
        oc = count_overlaps(b, ags, eps, device=torch.device("cpu"), chunk_elems=1000, weights=w)
        same = oc.shared == overlap and [s + u for s, u in zip(oc.shared, oc.unique)] == changed
        assert same is (w is weights or kind == "untied"), (kind, w, oc.shared, overlap)


@pytest.mark.parametrize("mode,R,eps", [("arm-r", 1.05, 1e-5), ("arm-r", 1.2, 1e-5), ("arm-r-v2", 1.2, 1e-3),
                                        ("arm-r-v2", 1.05, 1e-5)])
def test_presets_write_the_scripts_tensors(tiny, tmp_path, mode, R, eps):
    """`--preset` records the script's λ_t exactly and writes its float32 tensors bit for bit; the card and the
    recipe say the counts are over state_dict(), tied alias included."""
    kind, base, agents, loaded = tiny
    ref = script.run_script_rules(base, agents, mode, R, eps, loaded)
    assert None not in ref.lambdas and len(set(ref.lambdas)) > 1
    recipe = cli_merge(tmp_path / "m", base, agents, "--preset", script.MODES[mode], "--rescale-factor", str(R),
                       "--eps", str(eps))
    assert [row["lambda"] for row in recipe["lambdas"]] == ref.lambdas
    assert [row["shared"] for row in recipe["lambdas"]] == ref.overlap
    assert script.differing_elements(tmp_path / "m", ref.merged)[0] == 0
    assert recipe["spec"]["params"]["count_tied_twice"] is True and recipe["preset"]["name"] == script.MODES[mode]
    written = state(tmp_path / "m")
    assert ("lm_head.weight" in written) is (kind == "untied")
    if kind == "tied":  # the script's merged alias equals its merged embedding: one tensor written
        assert torch.equal(ref.merged["lm_head.weight"], ref.merged[EMBED])
    text = json.dumps(recipe["notes"]) + (tmp_path / "m" / "README.md").read_text()
    assert "over the loaded model's state_dict()" in text
    assert ("lm_head.weight (= model.embed_tokens.weight) is counted too" in text) is (kind == "tied")


def test_the_switch_on_ram_plus_soft(tiny, tmp_path):
    """Without a preset RAM+s counts stored tensors once (λ_t differ from the script's on a tied model);
    --count-tied-twice gives the script's λ_t and tensors, and the recipe carries the parameter."""
    kind, base, agents, loaded = tiny
    ref = script.run_script_rules(base, agents, "arm-r", 1.05, 1e-5, loaded)
    once = cli_merge(tmp_path / "once", base, agents, "--method", "ram_plus_soft", "--r", "0.05")
    twice = cli_merge(tmp_path / "twice", base, agents, "--method", "ram_plus_soft", "--r", "0.05",
                      "--count-tied-twice")
    expect = [1.0 + 0.05 * ov / ch for ov, ch in zip(ref.overlap, ref.changed)]  # r = 0.05, the script's rule
    assert [row["lambda"] for row in twice["lambdas"]] == expect
    assert ([row["lambda"] for row in once["lambdas"]] == expect) is (kind == "untied")
    assert twice["spec"]["params"]["count_tied_twice"] is True and once["spec"]["params"]["count_tied_twice"] is False


@pytest.fixture(scope="module")
def trios():
    """Each bundled trio as the script holds it (loaded once per module)."""
    held = {}

    def get(trio: str):
        if trio not in held:
            dirs = [script.TRIOS[trio] / m for m in ("base", "code", "tool", "memory")]
            held[trio] = (dirs, (script.load_like_script(dirs[0]), [script.load_like_script(d) for d in dirs[1:]]))
        return held[trio]

    return get


@pytest.mark.parametrize("trio", list(script.TRIOS))
@pytest.mark.parametrize("mode,R,eps", script.CASES)
def test_bundled_trios_match_the_script(trios, tmp_path, trio, mode, R, eps):
    """On both bundled trios (tied embeddings): the λ_t the script prints, recorded to the last bit, and its
    float32 tensors written exactly (before the presets counted tied aliases: 108,922 / 35,933 / 91,151 … differ)."""
    dirs, loaded = trios(trio)
    ref = script.run_script_rules(dirs[0], dirs[1:], mode, R, eps, loaded)
    refs = [f"{trio}:{m}" for m in ("base", "code", "tool", "memory")]
    assert main(["merge", *refs, "--preset", script.MODES[mode], "--rescale-factor", str(R), "--eps", str(eps),
                 "--out", str(tmp_path / "m"), "--out-dtype", "float32", "--quiet"]) == 0
    recipe = json.loads((tmp_path / "m" / "ram_recipe.json").read_text())
    assert [row["lambda"] for row in recipe["lambdas"]] == ref.lambdas
    assert script.differing_elements(tmp_path / "m", ref.merged) == (0, 328_512)


def test_sweep_candidates_count_as_the_merge(trios):
    """A sweep's candidate with the preset's parameters uses the script's counts too (not the analysis's)."""
    from transformers import AutoModelForCausalLM

    from merging.presets import apply_preset

    dirs, loaded = trios("demo")
    ref = script.run_script_rules(dirs[0], dirs[1:], "arm-r", 1.05, 1e-5, loaded)
    inputs = CandidateInputs(str(dirs[0]), [str(d) for d in dirs[1:]], mode="stream")
    method, params = apply_preset("authors-soft", None, {}, 1.05)
    module = AutoModelForCausalLM.from_pretrained(str(dirs[0]), dtype=torch.float32, trust_remote_code=False)
    assert inputs.merge_into(module, method, params).lambdas == ref.lambdas
    once = inputs.merge_into(module, method, {**params, "count_tied_twice": False}).lambdas
    assert all(a != b for a, b in zip(once, ref.lambdas))

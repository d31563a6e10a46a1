"""A wrong model is never written with exit 0: parameters that overflow, a non-finite result, a merge that changes
nothing, an agent given twice, mismatches that would lose an agent, agents that cancel, too many agents or tensors —
each refused with one line naming the cause; the same inputs always give the same bytes. Rows of the "Trust" table
in docs/security.md."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.cli_helpers import (
    hostile_family,
    merge_argv,
    no_leftovers,
    run,
)
from tests.factory import state
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


# --- 4. wrong models with exit 0 --------------------------------------------------------------------

@pytest.mark.parametrize("extra,fragment", [
    (("--method", "task_arithmetic", "--lambda", "1e39"), "lambda"),
    (("--method", "ram_plus", "--r", "1e39"), "r=1e+39"),
    (("--method", "ram_plus", "--r", "1e37", "--alpha", "1000"), "largest λ_t"),
    (("--method", "dare_ta", "--drop-rate", "0.9999999999"), "1/(1−p)"),
])
def test_parameters_that_overflow_float32_are_refused_before_any_work(capsys, family, tmp_path, extra, fragment):
    base, agents = family
    out = tmp_path / "out"
    code, _, err = run(capsys, "merge", base, *agents, "--out", out, "--quiet", *extra)
    assert code == 2 and fragment in err and "float32" in err and not out.exists(), err


def test_non_finite_result_aborts_naming_tensor_index_and_parameter(capsys, family, tmp_path):
    base, agents = family
    out = tmp_path / "out"
    code, _, err = run(capsys, "merge", base, *agents, "--method", "task_arithmetic", "--lambda", "1e7",
                       "--out-dtype", "float16", "--out", out, "--quiet")
    assert code == 2 and "is not finite" in err and "flat index" in err and "lambda=1e+07" in err, err
    assert "model." in err and not out.exists()
    no_leftovers(tmp_path)


@pytest.mark.parametrize("extra", [("--method", "ram", "--eps", "1e9"),
                                   ("--method", "ties", "--density", "1e-9"),
                                   ("--method", "dare_ta", "--drop-rate", "0.99999999")])
def test_merge_that_changes_nothing_is_refused_unless_allowed(capsys, family, tmp_path, extra):
    base, agents = family
    out = tmp_path / "noop"
    code, _, err = run(capsys, "merge", base, *agents, "--out", out, "--quiet", *extra)
    if "1/(1−p)" in err:  # p rounds to 1 in float32: refused even earlier, as an invalid factor
        return
    assert code == 2 and "changes nothing" in err and "--allow-noop" in err and not out.exists(), err
    code, _, err = run(capsys, "merge", base, *agents, "--out", out, "--quiet", "--allow-noop", *extra)
    assert code == 0 and "WARNING" in err
    assert "changes nothing" in (out / "README.md").read_text()


def test_byte_identical_agent_under_another_path_is_refused(capsys, models, tmp_path):
    base, agents = models
    twin = shutil.copytree(agents[0], tmp_path / "twin")
    for argv in (merge_argv(base, [agents[0], twin], tmp_path / "out"),
                 ["analyze", base, agents[0], twin, "--quiet"]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "same weights as agent" in err, err
    assert not (tmp_path / "out").exists()


def test_fp32_agent_with_smaller_vocabulary_is_taken_at_full_precision(capsys, family, tmp_path):
    """τ comes from the stored float32 values even where the rows are padded with a bf16 base's."""
    from merging.engine.tensor_merge import merge_in_memory

    base, agents = family
    b = state(base)
    g = torch.Generator().manual_seed(7)
    small = {}
    for name, t in b.items():
        v = t.float() + torch.randn(t.shape, generator=g) * 1e-3  # values bf16 cannot hold
        small[name] = v[:-2].contiguous() if "embed_tokens" in name or "lm_head" in name else v
    agent = tmp_path / "fp32-small-vocab"
    agent.mkdir()
    save_file(small, agent / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(base / "config.json", agent / "config.json")
    out = tmp_path / "out"
    code, _, err = run(capsys, "merge", base, agents[0], agent, "--method", "task_arithmetic", "--on-mismatch",
                       "base", "--out-dtype", "float32", "--out", out, "--quiet")
    assert code == 0, err
    name = "model.embed_tokens.weight"
    a0 = state(agents[0])[name].float()
    a1 = torch.cat([small[name], b[name][-2:].float()])
    expect = b[name].float() + merge_in_memory("task_arithmetic", torch.stack([a0 - b[name].float(),
                                                                                a1 - b[name].float()]))
    assert torch.equal(load_file(out / "model.safetensors")[name], expect)


def _renamed(src: Path, dst: Path, rename) -> Path:
    dst.mkdir()
    save_file({rename(k): v for k, v in state(src).items()}, dst / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(src / "config.json", dst / "config.json")
    return dst


@pytest.mark.parametrize("rename,hint", [
    (lambda k: k.removeprefix("model."), "'model.' prefix"),
    (lambda k: "base_model.model." + k, "PEFT"),
])
def test_mismatch_policy_cannot_hide_losing_an_agent(capsys, family, tmp_path, rename, hint):
    base, agents = family
    odd = _renamed(agents[1], tmp_path / "odd", rename)
    out = tmp_path / "out"
    for policy in ("error", "base"):
        code, _, err = run(capsys, *merge_argv(base, [agents[0], odd], out, "--on-mismatch", policy))
        assert code == 2 and hint in err, err
    code, _, err = run(capsys, *merge_argv(base, [agents[0], odd], out, "--on-mismatch", "base"))
    share = float(err.split("would drop ")[1].split(" %")[0])
    assert share > 80 and "of agent odd" in err and not out.exists()  # lm_head keeps its name: not 100 %


def test_fused_moe_experts_get_a_hint(capsys, tmp_path):
    def moe(folder: Path, fused: bool, seed: int) -> Path:
        folder.mkdir()
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(2, 8, 4, generator=g).to(torch.bfloat16)
        t = {"model.layers.0.mlp.experts.up_proj": w} if fused else {
            f"model.layers.0.mlp.experts.{i}.up_proj.weight": w[i].contiguous() for i in range(2)}
        t["model.norm.weight"] = torch.ones(4, dtype=torch.bfloat16) + seed
        save_file(t, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"]}))
        return folder

    base, a, fused = moe(tmp_path / "b", False, 0), moe(tmp_path / "a", False, 1), moe(tmp_path / "f", True, 2)
    code, _, err = run(capsys, *merge_argv(base, [a, fused], tmp_path / "out", "--on-mismatch", "base"))
    assert code == 2 and "MoE experts" in err, err


def test_lora_adapter_is_named_as_an_adapter(capsys, family, tmp_path):
    base, agents = family
    adapter = tmp_path / "my-lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(8, 32)},
              adapter / "adapter_model.safetensors")
    for argv in (["inspect", base, agents[0], adapter], merge_argv(base, [agents[0], adapter], tmp_path / "o")):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "LoRA/PEFT adapter" in err and "merge_and_unload" in err, err


# --- 5. nested and aliased data, lists longer than a merge takes ----------------------------------------

def test_a_recipe_with_a_million_agents_is_refused_before_anything_is_opened(capsys, models, tmp_path, monkeypatch):
    """A recipe with 10^5 agents was refused after 145 s (quadratic); one with 10^6 (14.9 MB, under
    the size cap) ran for 25 minutes. The agent count is checked first, before any model is looked at."""
    import merging.reading.checkpoint as checkpoint
    import merging.reading.refs as refs

    base, agents = models
    out = tmp_path / "m"
    assert run(capsys, *merge_argv(base, agents, out))[0] == 0
    doc = json.loads((out / "ram_recipe.json").read_text())
    monkeypatch.setattr(checkpoint, "open_checkpoint", lambda *a, **k: pytest.fail("a model was opened"))
    monkeypatch.setattr(refs, "parse_ref", lambda *a, **k: pytest.fail("a reference was parsed"))
    for n in (100_000, 1_000_000):
        doc["spec"]["agents"] = [f"m/{i}" for i in range(n)]
        bad = tmp_path / f"r{n}.json"
        bad.write_text(json.dumps(doc))
        assert bad.stat().st_size < 16 << 20
        code, _, err = run(capsys, "run", bad, "--out", tmp_path / "x", "--quiet")
        assert code == 2 and f"{n:,} agents given" in err and "at most 64" in err, err
    code, _, err = run(capsys, "merge", base, *[agents[0]] * 65, "--method", "ram", "--out", tmp_path / "y")
    assert code == 2 and "at most 64" in err


# --- 6. every float dtype we write is checked ------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"])
def test_every_written_dtype_is_checked_finite_and_changed(capsys, tmp_path, dtype):
    """The finite and "changed" checks skipped F8_E4M3/F8_E5M2: `--lambda 1e6` wrote Inf with
    exit 0, a real fp8 merge was refused as "changes nothing", and --allow-noop died with KeyError after writing."""
    from merging.common.dtypes import ST_TO_TORCH

    folders = hostile_family(tmp_path / "in", names=["model.layers.0.mlp.up_proj.weight", "model.norm.weight"],
                              dtype=ST_TO_TORCH[dtype])
    out = tmp_path / "out"
    code, _, err = run(capsys, "merge", *folders, "--method", "task_arithmetic", "--lambda", "3e38", "--out", out,
                       "--quiet")
    assert code == 2 and ("is not finite" in err or "is beyond" in err) and not out.exists(), err
    code, _, err = run(capsys, "merge", *folders, "--method", "task_arithmetic", "--out", out, "--quiet")
    assert code == 0, err  # a real change is seen as one
    merged = load_file(out / "model.safetensors")
    assert all(t.dtype == ST_TO_TORCH[dtype] and bool(torch.isfinite(t.float()).all()) for t in merged.values())
    code, _, err = run(capsys, "merge", *folders, "--method", "ram", "--eps", "1e9", "--out", tmp_path / "noop",
                       "--quiet")
    assert code == 2 and "changes nothing" in err, err
    code, _, err = run(capsys, "merge", *folders, "--method", "ram", "--eps", "1e9", "--out", tmp_path / "noop",
                       "--quiet", "--allow-noop")
    assert code == 0 and "WARNING" in err and (tmp_path / "noop" / "README.md").exists(), err


def test_agents_that_cancel_give_no_merge_only_rounding(capsys, tmp_path):
    """Two agents that differ only in sign gave a model 1e-7 away from the base, accepted as a
    real merge. A merge whose largest change is one step of the output dtype is refused like a no-op."""
    g = torch.Generator().manual_seed(0)
    base = {"model.layers.0.mlp.up_proj.weight": torch.randn(256, generator=g) * 0.02}
    tau = {k: torch.randn(v.shape, generator=g) * 1e-3 for k, v in base.items()}
    folders = []
    for name, sign in (("base", 0), ("plus", 1), ("minus", -1)):
        f = tmp_path / name
        f.mkdir()
        save_file({k: v + sign * tau[k] for k, v in base.items()}, f / "model.safetensors")
        (f / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
        folders.append(f)
    out = tmp_path / "out"
    code, _, err = run(capsys, "merge", *folders, "--method", "task_arithmetic", "--out", out, "--quiet")
    assert code == 2 and "only by float32 rounding" in err and not out.exists(), err
    code, _, err = run(capsys, "merge", *folders, "--method", "task_arithmetic", "--out", out, "--quiet",
                       "--allow-noop")
    assert code == 0 and "WARNING" in err and "rounding" in (out / "README.md").read_text()


# --- 9. the same inputs give the same model ---------------------------------------------------------------

@pytest.mark.parametrize("method", ["dare_ta", "dare_ties"])
def test_same_models_under_any_spelling_give_byte_identical_merges(capsys, tmp_path, monkeypatch, method):
    """DARE's masks were keyed by the agent reference as typed, so `demo:code`,
    `assets/demo/models/code` and `./assets/demo/models/code/` gave three different merges. Now by position."""
    import hashlib

    from merging.reading.refs import demo_root

    demo = demo_root()
    names = ["code", "tool", "memory"]
    copy = tmp_path / "elsewhere" / "copies"
    for n in ["base", *names]:
        shutil.copytree(demo / n, copy / n)
    (tmp_path / "link").symlink_to(demo)
    monkeypatch.chdir(ROOT)
    rel = os.path.relpath(demo, ROOT)
    spellings = {
        "demo": ["demo:base", *[f"demo:{n}" for n in names]],
        "absolute": [str(demo / n) for n in ["base", *names]],
        "relative": [f"{rel}/{n}" for n in ["base", *names]],
        "dotted": [f"./{rel}/{n}/" for n in ["base", *names]],
        "symlink": [str(tmp_path / "link" / n) for n in ["base", *names]],
        "copy": [str(copy / n) for n in ["base", *names]],
    }
    digests = {}
    for label, refs in spellings.items():
        out = tmp_path / f"out-{label}"
        code, _, err = run(capsys, "merge", *refs, "--method", method, "--drop-rate", "0.3", "--out", out, "--quiet")
        assert code == 0, err
        digests[label] = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(out.glob("*.safetensors")))).hexdigest()
    assert len(set(digests.values())) == 1, digests


def test_an_analysis_of_very_many_tensors_says_its_cost_before_it_starts(tmp_path, monkeypatch, capsys):
    """100,000 tiny tensors took minutes and gigabytes to analyze without a word. Above
    MANY_TENSORS float tensors `analyze` says, before the pass, how many rows of statistics it will keep and
    about how much memory that takes; below it, nothing is said."""
    import torch
    from safetensors.torch import save_file

    from analysis import stats
    from merging.reading.checkpoint import open_checkpoint

    g = torch.Generator().manual_seed(0)
    folders = []
    for name in ("base", "a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        t = {f"model.layers.{i}.w": torch.randn(4, generator=g) for i in range(40)}
        save_file(t, str(folder / "model.safetensors"))
        (folder / "config.json").write_text('{"architectures": ["Tiny"]}')
        folders.append(folder)
    with open_checkpoint(str(folders[0])) as base:
        assert stats.size_note(base, 2, [1e-5, 1e-4]) is None
        monkeypatch.setattr(stats, "MANY_TENSORS", 30)
        note = stats.size_note(base, 2, [1e-5, 1e-4])
    assert note.startswith("40 float tensors") and "240 rows" in note  # 40 × 2 ε × (2 agents + 1 pair)
    code, out, err = run(capsys, "analyze", *folders, "--no-cache")
    assert code == 0 and err.splitlines()[0].startswith("note: 40 float tensors"), err
    code, out, err = run(capsys, "analyze", *folders, "--no-cache", "--quiet")
    assert code == 0 and "note:" not in err

"""A tied base (tie_word_embeddings true, no lm_head on disk) with agents saved with an explicit lm_head, end to
end through the CLI on tiny real Qwen2 models: a head equal to the embeddings is tied (merged as if absent);
a head untied by training is refused with both ways out named, kept-tie under --on-mismatch base, and written
as an untied head with --untie — every merged value equal to an independent numpy computation, every output
loaded by transformers and run forward."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ram_studio.cli import main
from tests.factory import checksums, make_agent, make_base, make_head_agent, state

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """A tied bf16 base; a plain tied agent, one with an explicit head equal to its embeddings, one whose head
    was untied by training; all checked unchanged at the end."""
    root = tmp_path_factory.mktemp("tied")
    base = make_base(root / "base", shard=None, tie=True)
    plain = make_agent(base, root / "plain", 0.1, seed=1, scale=0.002)
    equal = make_head_agent(base, root / "equal-head", seed=2)
    untied = make_head_agent(base, root / "untied-head", seed=3, head_noise=0.004)
    before = checksums([base, plain, equal, untied])
    yield base, plain, equal, untied
    assert checksums([base, plain, equal, untied]) == before


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def f32(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.float32).numpy()


def bf16(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)


def ram_numpy(base: np.ndarray, agents: list[np.ndarray], eps: float = 1e-5) -> np.ndarray:
    """RAM (Eq. 7) in float32: the mean of the active τ where ≥ 2 agents changed an element, τ_t where only t did."""
    taus = [a - base for a in agents]
    masks = [np.abs(t) > np.float32(eps) for t in taus]
    total = np.zeros_like(base)
    for t, m in zip(taus, masks):
        total = total + t * m
    count = sum(m.astype(np.int64) for m in masks)
    merged = np.where(count >= 2, total / np.maximum(count, 1).astype(np.float32), total)
    return base + merged.astype(np.float32)


def loads_and_runs(folder: Path, tied_expected: bool) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False)
    assert model.config.tie_word_embeddings is tied_expected
    same = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert same is tied_expected
    logits = model(torch.tensor([[3, 5, 7, 11]])).logits
    assert logits.shape == (1, 4, model.config.vocab_size) and torch.isfinite(logits.float()).all()


def test_head_equal_to_its_embeddings_is_treated_as_tied(capsys, tied, tmp_path):
    base, plain, equal, _ = tied
    code, out, err = run(capsys, "inspect", base, plain, equal)
    assert code == 0, err
    assert "NaN" not in out and "treated as tied" in out and "compatible" in out, out
    dest = tmp_path / "merged"
    code, out, err = run(capsys, "merge", base, plain, equal, "--method", "ram", "--out", dest, "--quiet")
    assert code == 0, err
    merged = state(dest)
    assert HEAD not in merged and json.loads((dest / "config.json").read_text())["tie_word_embeddings"] is True
    b, models = state(base), [state(plain), state(equal)]
    for name in b:
        want = bf16(ram_numpy(f32(b[name]), [f32(m[name]) for m in models]))
        assert torch.equal(merged[name], want), name
    loads_and_runs(dest, True)


def test_untied_head_is_refused_naming_both_ways_out(capsys, tied, tmp_path):
    base, plain, _, untied = tied
    code, out, err = run(capsys, "inspect", base, plain, untied)
    assert code == 2
    assert "NaN" not in out and "untied_head" in out and "differs from its model.embed_tokens.weight" in out, out
    dest = tmp_path / "refused"
    code, _, err = run(capsys, "merge", base, plain, untied, "--method", "ram", "--out", dest, "--quiet")
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err
    assert "--untie" in err and "--on-mismatch base" in err and "untied by training" in err, err
    assert not dest.exists()


def test_keeping_the_base_tie_drops_only_the_head_update(capsys, tied, tmp_path):
    """The suggested --on-mismatch base now merges (the head is 15 % of the agent, but its loss is the known,
    stated cost of keeping the tie): the embeddings merge the agents' embedding updates, no head is written."""
    base, plain, _, untied = tied
    dest = tmp_path / "kept-tie"
    code, out, err = run(capsys, "merge", base, plain, untied, "--method", "task_arithmetic", "--out", dest,
                         "--on-mismatch", "base")
    assert code == 0, err
    assert "the base's tie is kept, so its head update is dropped" in err, err
    merged, b, models = state(dest), state(base), [state(plain), state(untied)]
    assert HEAD not in merged
    for name in b:
        want = f32(b[name]) + ((f32(models[0][name]) - f32(b[name])) + (f32(models[1][name]) - f32(b[name])))
        assert torch.equal(merged[name], bf16(want)), name
    card = (dest / "README.md").read_text()
    assert "head update is dropped" in card
    loads_and_runs(dest, True)


def test_untie_writes_a_head_merged_from_the_base_embeddings(capsys, tied, tmp_path):
    """--untie: lm_head = θ0 (the base's embeddings) + the merge of each agent's head update, where a tied
    agent's head is its embeddings; config tie_word_embeddings false; the embeddings merge as before."""
    base, plain, equal, untied = tied
    dest = tmp_path / "untied"
    code, out, err = run(capsys, "merge", base, plain, equal, untied, "--method", "ram", "--out", dest, "--untie",
                         "--quiet")
    assert code == 0, err
    merged, b = state(dest), state(base)
    agents = [state(plain), state(equal), state(untied)]
    heads = [f32(a.get(HEAD, a[EMBED])) for a in agents]
    assert torch.equal(merged[HEAD], bf16(ram_numpy(f32(b[EMBED]), heads)))
    assert torch.equal(merged[EMBED], bf16(ram_numpy(f32(b[EMBED]), [f32(a[EMBED]) for a in agents])))
    assert not torch.equal(merged[HEAD], merged[EMBED])  # the untied agent's head update is kept
    cfg = json.loads((dest / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False
    recipe = json.loads((dest / "ram_recipe.json").read_text())
    assert recipe["spec"]["untie"] is True
    # the recipe re-runs to the same bytes
    again = tmp_path / "again"
    code, _, err = run(capsys, "run", dest / "ram_recipe.json", "--out", again, "--quiet")
    assert code == 0, err
    assert (again / "model.safetensors").read_bytes() == (dest / "model.safetensors").read_bytes()
    loads_and_runs(dest, False)


def test_untie_on_an_untied_base_is_refused(capsys, tmp_path):
    base = make_base(tmp_path / "untied-base", shard=None, tie=False)
    agents = [make_agent(base, tmp_path / f"a{i}", 0.1, seed=i, scale=0.002) for i in range(2)]
    code, _, err = run(capsys, "merge", base, *agents, "--method", "ram", "--out", tmp_path / "o", "--untie")
    assert code == 2 and "--untie" in err and "not tied" in err, err


def test_a_tied_llama_with_an_untied_agent(capsys, tmp_path):
    """The same on Llama (Llama-3.2-1B/3B tie their head): a tiny LlamaForCausalLM from its transformers config,
    an agent whose head training untied; refused, then merged with --untie into a model that loads and runs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.factory import save_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    base = tmp_path / "llama-base"
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(base)
    save_tokenizer(base)
    assert HEAD not in state(base)
    plain = make_agent(base, tmp_path / "llama-plain", 0.1, seed=4, scale=0.002)
    untied = make_head_agent(base, tmp_path / "llama-untied", seed=5, head_noise=0.004)
    code, _, err = run(capsys, "merge", base, plain, untied, "--method", "task_arithmetic", "--out", tmp_path / "no")
    assert code == 2 and "--untie" in err, err
    dest = tmp_path / "llama-merged"
    code, _, err = run(capsys, "merge", base, plain, untied, "--method", "task_arithmetic", "--out", dest, "--untie",
                       "--quiet")
    assert code == 0, err
    merged, b = state(dest), state(base)
    heads = [f32(state(plain)[EMBED]), f32(state(untied)[HEAD])]
    want = f32(b[EMBED]) + ((heads[0] - f32(b[EMBED])) + (heads[1] - f32(b[EMBED])))
    assert torch.equal(merged[HEAD], bf16(want))
    loads_and_runs(dest, False)

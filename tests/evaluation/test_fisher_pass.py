"""The diagonal Fisher pass against an independent computation: torch autograd, one example at a time, in float64,
on tiny real Qwen2 models (demo tokenizer, tied and untied embeddings) stored in bf16 and in fp32; answers
(reference, greedy, sampled) against transformers' own decoding; snapshots equal separate passes bit for bit; the
cache (keyed by content, reused, placed outside the inputs) and the errors for data or models a Fisher cannot use."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from demo.evaluator import DemoEvaluator
from demo.modeling import build_tokenizer, generation_config, new_model
from evaluation.fisher import FisherPlan, agent_prints, ensure_fishers, resolve_tasks
from evaluation.fisher_cache import fisher_dir
from evaluation.fisher_pass import FisherData, FisherExample, fisher_pass
from merging.common.errors import RamStudioError
from merging.reading.checkpoint import open_checkpoint

CPU = torch.device("cpu")


def tiny_demo_model(folder: Path, *, seed: int = 0, dtype=torch.bfloat16, tie: bool = True) -> Path:
    """A tiny Qwen2ForCausalLM from a transformers config with the demo's character tokenizer, saved by
    transformers in `dtype` (the demo evaluator can score and load it)."""
    tok = build_tokenizer("char")
    model = new_model(tok, seed, hidden=16, layers=1, heads=2, intermediate=32, tie=tie)
    with torch.no_grad():  # larger logits than the default init, so that answers and gradients vary
        for p in model.parameters():
            p.mul_(4.0)
    model = model.to(dtype)
    model.generation_config = generation_config()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def brute_force(folder: Path, pairs: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    """mean_n (∂ Σ_i log p(a_i | prompt, a_<i) / ∂θ)², float64, torch.autograd.grad per example, full logits."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, use_safetensors=True,
                                                 trust_remote_code=False).eval()
    names = dict(model.named_parameters())  # tied weights appear once, under the embedding's name
    total = {n: torch.zeros(p.shape, dtype=torch.float64) for n, p in names.items()}
    for prompt, answer in pairs:
        logits = model(input_ids=torch.tensor([prompt + answer])).logits[0]
        logp = torch.log_softmax(logits.double(), -1)[len(prompt) - 1:-1]
        ll = logp[torch.arange(len(answer)), torch.tensor(answer)].sum()
        for (n, _), g in zip(names.items(), torch.autograd.grad(ll, list(names.values()), allow_unused=True)):
            if g is not None:
                total[n] += g.double() ** 2
    return {n: t / len(pairs) for n, t in total.items()}


def close(ours: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """float32 against float64: 2e-5 relative, or 1e-6 of the tensor's largest value (an embedding row's gradient
    sums many positions' contributions, so its small entries carry float32's cancellation error)."""
    scale = float(expected.abs().max())
    assert torch.allclose(ours.double(), expected, rtol=2e-5, atol=1e-6 * scale + 1e-30), (
        name, float((ours.double() - expected).abs().max()), scale)


def run_pass(folder: Path, task: str, n: int, rule: str, snapshots=None, seed: int = 0):
    """The pass as the merge runs it, through the demo evaluator; returns (F per N, answers per example)."""
    ev = DemoEvaluator()
    loaded = ev.load(folder)
    agent = open_checkpoint(folder)
    names = [k for k in agent.tensors]
    out = {}
    fisher_pass(loaded.module, loaded.tokenizer, ev.fisher_examples(task, n), rule, names, snapshots or [n],
                lambda k, stats, tensors: out.__setitem__(k, dict(tensors)), seed=seed)
    return out


@pytest.mark.parametrize("dtype,tie", [(torch.bfloat16, True), (torch.float32, False)])
def test_reference_fisher_equals_brute_force_autograd(tmp_path, dtype, tie):
    folder = tiny_demo_model(tmp_path / "m", dtype=dtype, tie=tie)
    ev = DemoEvaluator()
    data = ev.fisher_examples("tool", 6)
    loaded = ev.load(folder)
    tok = loaded.tokenizer
    pairs = [(tok(e.prompt)["input_ids"], tok(e.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
             for e in data.examples]
    ours = run_pass(folder, "tool", 6, "reference")[6]
    expected = brute_force(folder, pairs)
    stored = open_checkpoint(folder).tensors
    assert set(ours) == set(stored)  # every stored tensor, named as stored (tied lm_head is not stored)
    for name, f in ours.items():
        assert f.dtype == torch.float32 and tuple(f.shape) == stored[name].shape
        close(f, expected[name], name)
    assert all(bool((f > 0).any()) for f in ours.values())  # every tensor reached by some gradient


def test_greedy_answers_are_transformers_greedy_decoding(tmp_path):
    folder = tiny_demo_model(tmp_path / "m")
    ev = DemoEvaluator()
    loaded = ev.load(folder)
    data = ev.fisher_examples("code", 4)
    from evaluation.fisher_pass import answer_for

    for ex in data.examples:
        prompt = loaded.tokenizer(ex.prompt)["input_ids"]
        ours = answer_for(loaded.module, loaded.tokenizer, ex, "greedy", prompt, 0, 0)
        theirs = loaded.module.generate(input_ids=torch.tensor([prompt]), do_sample=False,
                                        max_new_tokens=ex.max_new_tokens, eos_token_id=0, pad_token_id=0)
        assert ours == theirs[0, len(prompt):].tolist()


def test_sampled_answers_are_seeded_per_example_and_the_fisher_is_their_brute_force(tmp_path):
    folder = tiny_demo_model(tmp_path / "m")
    a = run_pass(folder, "memory", 5, "sampled", seed=1)[5]
    b = run_pass(folder, "memory", 5, "sampled", seed=1)[5]
    c = run_pass(folder, "memory", 5, "sampled", seed=2)[5]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    ev = DemoEvaluator()
    loaded = ev.load(folder)
    from evaluation.fisher_pass import answer_for

    pairs = []
    for i, ex in enumerate(ev.fisher_examples("memory", 5).examples):
        prompt = loaded.tokenizer(ex.prompt)["input_ids"]
        pairs.append((prompt, answer_for(loaded.module, loaded.tokenizer, ex, "sampled", prompt, 0, 1 * 1_000_003 + i)))
    assert len({tuple(p[1]) for p in pairs}) > 1  # samples, not one repeated answer
    expected = brute_force(folder, pairs)
    for name, f in a.items():
        close(f, expected[name], name)


def test_snapshots_of_one_pass_equal_separate_passes_bit_for_bit(tmp_path):
    folder = tiny_demo_model(tmp_path / "m")
    both = run_pass(folder, "code", 6, "greedy", snapshots=[3, 6])
    alone = run_pass(folder, "code", 3, "greedy")
    assert all(torch.equal(both[3][k], alone[3][k]) for k in alone[3])
    assert any(not torch.equal(both[3][k], both[6][k]) for k in alone[3])


def test_cache_keyed_by_content_reused_and_described(tmp_path, monkeypatch):
    base = open_checkpoint(tiny_demo_model(tmp_path / "base", seed=0))
    agents = [open_checkpoint(tiny_demo_model(tmp_path / name, seed=s)) for name, s in (("code", 1), ("tool", 2))]
    ev = DemoEvaluator()
    tasks = resolve_tasks([a.label for a in agents], ev.tasks, None)
    assert tasks == ("code", "tool")
    plan = FisherPlan(tasks, "reference", (2, 4))
    prints = agent_prints(agents)
    first = ensure_fishers(ev, base, agents, prints, plan, device=CPU)
    files = sorted(fisher_dir().glob("*.safetensors"))
    assert len(files) == 4 and {f[4].path for f in first} <= set(files)
    side = json.loads(first[0][4].path.with_suffix(".json").read_text())
    assert side["agent"]["weights_xxh3_128"] == prints[0] and side["task"] == "code" and side["split"] == "train"
    assert side["n"] == 4 and side["rule"] == "reference" and side["seconds"] > 0
    assert "one example at a time" in side["estimator"]
    mtimes = [f.stat().st_mtime_ns for f in files]

    import evaluation.fisher as fisher_mod

    calls = []

    class Computed(Exception):
        pass

    def no_pass(*a, **k):
        calls.append(a[3])
        raise Computed()

    monkeypatch.setattr(fisher_mod, "fisher_pass", no_pass)
    again = ensure_fishers(ev, base, agents, prints, plan, device=CPU)
    assert calls == [] and [f[4].path for f in again] == [f[4].path for f in first]
    assert [f.stat().st_mtime_ns for f in files] == mtimes
    with pytest.raises(Computed):  # another rule is another entry: a pass would run
        ensure_fishers(ev, base, agents, prints, FisherPlan(tasks, "greedy", (4,)), device=CPU)
    assert calls == ["greedy"]
    f4 = load_file(first[0][4].path)
    assert all(torch.isfinite(t).all() and (t >= 0).all() for t in f4.values())


def test_cache_inside_an_input_is_refused(tmp_path, monkeypatch):
    base = open_checkpoint(tiny_demo_model(tmp_path / "base"))
    agent = open_checkpoint(tiny_demo_model(tmp_path / "code", seed=1))
    monkeypatch.setenv("RAM_STUDIO_CACHE", str(tmp_path / "code" / "cache"))
    with pytest.raises(RamStudioError, match="cache"):
        ensure_fishers(DemoEvaluator(), base, [agent], agent_prints([agent]), FisherPlan(("code",), "reference", (2,)),
                       device=CPU)
    assert not (tmp_path / "code" / "cache").exists()


def test_tasks_resolved_by_name_or_given():
    assert resolve_tasks(["code", "memory"], ("code", "tool", "memory"), None) == ("code", "memory")
    assert resolve_tasks(["code"], ("ram_demo_code", "ram_demo_tool"), None) == ("ram_demo_code",)
    assert resolve_tasks(["a", "b"], (), ["tool", "code"]) == ("tool", "code")
    with pytest.raises(RamStudioError, match="cannot tell which task agent agent_x"):
        resolve_tasks(["agent_x"], ("code", "tool"), None)
    with pytest.raises(RamStudioError, match="2 Fisher task"):
        resolve_tasks(["a", "b", "c"], (), ["code", "tool"])


def test_data_and_models_a_fisher_cannot_use(tmp_path):
    folder = tiny_demo_model(tmp_path / "m")
    ev = DemoEvaluator()
    with pytest.raises(RamStudioError, match="unknown demo task 'poetry'"):
        ev.fisher_examples("poetry", 4)
    loaded = ev.load(folder)
    data = FisherData("t", "train", (FisherExample("C:x=1;print(x+1)>", None, 4),), "test")
    with pytest.raises(RamStudioError, match="no reference answers"):
        fisher_pass(loaded.module, loaded.tokenizer, data, "reference", ["model.norm.weight"], [1], lambda *a: None)
    with pytest.raises(RamStudioError, match="needs 2 examples"):
        fisher_pass(loaded.module, loaded.tokenizer, data, "greedy", ["model.norm.weight"], [2], lambda *a: None)
    mc = FisherData("t", "train", data.examples, "test", rules=("reference",))
    with pytest.raises(RamStudioError, match="does not apply"):
        fisher_pass(loaded.module, loaded.tokenizer, mc, "sampled", ["model.norm.weight"], [1], lambda *a: None)
    from tests.factory import (
        make_base,  # a model whose tokenizer cannot write the demo's prompts
    )

    with pytest.raises(RamStudioError, match="not a demo-compatible model"):
        ev.load(make_base(tmp_path / "other", shard=None))

"""Agents whose tokenizer extends the base's (`<think>`, `</think>`, `<tool_call>` appended, embeddings grown),
end to end through the CLI on tiny real Qwen2 models with tokenizers built locally: refused without
`--vocab union`, naming the tokens and the option; dropped and said so under `--on-mismatch base`; kept with
`--vocab union` — base rows merged as usual, each added row the mean of the agents that added it, config
vocab_size updated, the union tokenizer loading in transformers and encoding the added tokens to the agents'
ids; conflicting additions refused with their ids."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ram_studio.cli import main
from tests.factory import (
    checksums,
    make_agent,
    make_base,
    make_head_agent,
    make_vocab_agent,
    state,
)

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    """A tied base with 96 tokens; agent `think` adds <think> </think> (ids 96, 97), `tools` adds the same two
    and <tool_call> (98, special), `plain` adds nothing, `clash` adds <tool_call> at id 96."""
    root = tmp_path_factory.mktemp("vocab")
    base = make_base(root / "base", shard=None, tie=True)
    think = make_vocab_agent(base, root / "think", ["<think>", "</think>"], seed=10)
    tools = make_vocab_agent(base, root / "tools", ["<think>", "</think>"], seed=20)
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(tools, trust_remote_code=False)
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>"]})
    tok.save_pretrained(tools)
    t = state(tools)
    g = torch.Generator().manual_seed(21)
    t[EMBED] = torch.cat([t[EMBED], (torch.randn(1, t[EMBED].shape[1], generator=g) * 0.02).to(t[EMBED].dtype)])
    from safetensors.torch import save_file

    save_file(t, tools / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((tools / "config.json").read_text())
    cfg["vocab_size"] = 99
    (tools / "config.json").write_text(json.dumps(cfg))
    plain = make_agent(base, root / "plain", 0.1, seed=30, scale=0.002)
    clash = make_vocab_agent(base, root / "clash", ["<tool_call>"], seed=40)
    folders = [base, think, tools, plain, clash]
    before = checksums(folders)
    yield base, think, tools, plain, clash
    assert checksums(folders) == before


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def f32(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.float32).numpy()


def test_without_the_option_the_refusal_names_the_tokens_and_the_option(capsys, vocab, tmp_path):
    base, think, tools, plain, _ = vocab
    for command in (["inspect"], ["analyze", "--quiet"],
                    ["merge", "--method", "ram", "--out", str(tmp_path / "o"), "--quiet"]):
        code, _, err = run(capsys, command[0], base, think, tools, plain, *command[1:])
        assert code == 2, (command, err)
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: ") and "Traceback" not in err
        assert "'<think>'" in last and "'</think>'" in last and "'<tool_call>'" in last and "id 98" in last, last
        assert "--vocab union" in last and "--on-mismatch base" in last, last
    assert not (tmp_path / "o").exists()


def test_on_mismatch_base_drops_them_and_says_so(capsys, vocab, tmp_path):
    base, think, tools, plain, _ = vocab
    dest = tmp_path / "dropped"
    code, _, err = run(capsys, "merge", base, think, tools, plain, "--method", "task_arithmetic", "--out", dest,
                       "--on-mismatch", "base")
    assert code == 0, err
    assert state(dest)[EMBED].shape[0] == 96
    card = (dest / "README.md").read_text()
    assert "dropped" in card and "\\<think\\>" in card, card  # named, escaped for Markdown
    assert (dest / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()


def test_union_keeps_every_added_token(capsys, vocab, tmp_path):
    base, think, tools, plain, _ = vocab
    dest = tmp_path / "union"
    code, _, err = run(capsys, "merge", base, think, tools, plain, "--method", "task_arithmetic", "--out", dest,
                       "--vocab", "union", "--quiet")
    assert code == 0, err
    merged, b = state(dest), state(base)
    agents = [state(think), state(tools), state(plain)]
    e = merged[EMBED]
    assert e.shape == (99, 32) and HEAD not in merged
    # the base's rows: θ0 + Σ τ (task arithmetic, λ = 1) over the agents' first 96 rows, in float32
    rows = [f32(a[EMBED][:96]) for a in agents]
    want = f32(b[EMBED]) + (((rows[0] - f32(b[EMBED])) + (rows[1] - f32(b[EMBED]))) + (rows[2] - f32(b[EMBED])))
    assert torch.equal(e[:96], torch.from_numpy(want).to(torch.bfloat16))
    # added rows: <think>, </think> averaged over the two agents that added them; <tool_call> from its only adder
    for i in (96, 97):
        mean = (f32(agents[0][EMBED][i]) + f32(agents[1][EMBED][i])) / np.float32(2)
        assert torch.equal(e[i], torch.from_numpy(mean).to(torch.bfloat16)), i
    assert torch.equal(e[98], agents[1][EMBED][98])
    for name in b:
        if name != EMBED:
            want = f32(b[name]) + sum((f32(a[name]) - f32(b[name]) for a in agents), np.zeros_like(f32(b[name])))
            assert torch.equal(merged[name], torch.from_numpy(want).to(torch.bfloat16)), name
    cfg = json.loads((dest / "config.json").read_text())
    assert cfg["vocab_size"] == 99
    union = json.loads((dest / "tokenizer.json").read_text())["added_tokens"]
    assert [(t["id"], t["content"]) for t in union][-3:] == [(96, "<think>"), (97, "</think>"), (98, "<tool_call>")]
    assert union[-1]["special"] is True
    tok_cfg = json.loads((dest / "tokenizer_config.json").read_text())
    assert "<tool_call>" in tok_cfg.get("extra_special_tokens", [])

    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        PreTrainedTokenizerFast,
    )

    for tok in (PreTrainedTokenizerFast.from_pretrained(dest, trust_remote_code=False),
                AutoTokenizer.from_pretrained(dest, trust_remote_code=False)):
        assert tok.convert_tokens_to_ids(["<think>", "</think>", "<tool_call>"]) == [96, 97, 98]
        ids = tok("a<think>b</think><tool_call>", add_special_tokens=False)["input_ids"]
        assert ids[1] == 96 and ids[3:5] == [97, 98], ids
    ref = PreTrainedTokenizerFast.from_pretrained(tools, trust_remote_code=False)
    assert ref("a<think>b</think><tool_call>", add_special_tokens=False)["input_ids"] == ids
    model = AutoModelForCausalLM.from_pretrained(dest, trust_remote_code=False)
    logits = model(torch.tensor([ids])).logits
    assert logits.shape[-1] == 99 and torch.isfinite(logits.float()).all()


def test_union_with_an_untied_head_takes_added_rows_from_heads(capsys, vocab, tmp_path):
    """--vocab union with --untie: the head grows with the embeddings; an agent's added row in the head comes
    from its own head (its embeddings where it is tied)."""
    base, think, tools, _, _ = vocab
    head_agent = make_head_agent(base, tmp_path / "head", seed=50, head_noise=0.004)
    dest = tmp_path / "union-untied"
    code, _, err = run(capsys, "merge", base, think, tools, head_agent, "--method", "ram", "--out", dest,
                       "--vocab", "union", "--untie", "--quiet")
    assert code == 0, err
    merged = state(dest)
    assert merged[HEAD].shape == merged[EMBED].shape == (99, 32)
    t1, t2 = state(think), state(tools)
    mean = (f32(t1[EMBED][96]) + f32(t2[EMBED][96])) / np.float32(2)  # tied agents: their head is their embeddings
    assert torch.equal(merged[HEAD][96], torch.from_numpy(mean).to(torch.bfloat16))
    cfg = json.loads((dest / "config.json").read_text())
    assert cfg["vocab_size"] == 99 and cfg["tie_word_embeddings"] is False


def test_conflicting_additions_are_refused_with_their_ids(capsys, vocab, tmp_path):
    base, think, _, _, clash = vocab
    code, _, err = run(capsys, "merge", base, think, clash, "--method", "ram", "--out", tmp_path / "o",
                       "--vocab", "union", "--quiet")
    assert code == 2 and "conflicting added tokens at id 96" in err and "'<think>'" in err and "'<tool_call>'" in err
    assert not (tmp_path / "o").exists()


def test_union_without_additions_keeps_the_base_vocabulary(capsys, vocab, tmp_path):
    base, _, _, plain, _ = vocab
    other = make_agent(base, tmp_path / "other", 0.1, seed=60, scale=0.002)
    dest = tmp_path / "same"
    code, _, err = run(capsys, "merge", base, plain, other, "--method", "ram", "--out", dest, "--vocab", "union")
    assert code == 0 and "no agent adds tokens" in err, err
    assert (dest / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()

"""What a merge writes beside the weights, through the CLI on tiny real models: the precision note when the
output's dtype is coarser than an agent's (its numbers equal an independent count on the documented sample),
one dtype key in config.json, the card's pipeline_tag from the base's architecture, and a vision-language
model's processor files copied."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from merging.engine.precision import SAMPLE_STRIDE
from ram_studio.cli import main
from tests.factory import make_agent, make_base, state, write_like


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def fp32_agent(base, dst, seed: int, scale: float):
    """An fp32 agent: the base's values widened, plus an update of `scale` on a third of the elements (part of it
    below bf16's resolution at the base's values)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state(base).items():
        w = t.float()
        mask = torch.rand(w.shape, generator=g) < 0.3
        out[name] = (w + mask * torch.randn(w.shape, generator=g) * scale).contiguous()
    return write_like(base, dst, out)


def test_fp32_agents_into_a_bf16_output_say_what_falls_below_its_resolution(capsys, tmp_path):
    base = make_base(tmp_path / "base", shard=None, dtype=torch.float32)
    agents = [fp32_agent(base, tmp_path / f"fp32-{i}", 10 + i, s) for i, s in enumerate((1e-3, 1e-5))]
    dest = tmp_path / "merged"
    code, _, err = run(capsys, "merge", base, *agents, "--method", "task_arithmetic", "--out", dest, "--quiet",
                       "--out-dtype", "bfloat16")
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note: precision:")]
    assert len(notes) == 2, err
    b = state(base)
    for agent, note in zip(agents, notes):
        a = state(agent)
        changed = vanished = sampled = 0
        for name in sorted(b):  # every 64th element of each tensor, by flat index
            x, y = b[name].reshape(-1)[::SAMPLE_STRIDE], a[name].reshape(-1)[::SAMPLE_STRIDE]
            tau = y.double() - x.double()
            hit = tau != 0
            gone = hit & (y.to(torch.bfloat16) == x.to(torch.bfloat16))
            sampled += tau.numel()
            changed += int(hit.sum())
            vanished += int(gone.sum())
        share = re.search(r"([\d.]+) % of its changed elements", note).group(1)
        assert f"{100 * vanished / changed:.2f}" == share, (note, vanished, changed)
        assert f"{changed:,} changed of {sampled:,}" in note and agent.name in note and "F32 → BF16" in note
    small, large = (float(re.search(r"([\d.]+) %", n).group(1)) for n in notes)
    assert 1 < small < 20 and large > 50  # a 1e-3 update mostly survives bf16; a 1e-5 one mostly does not
    cfg = json.loads((dest / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16" and "torch_dtype" not in cfg
    card = (dest / "README.md").read_text()
    assert "below the output" in card


def test_no_precision_note_when_nothing_is_coarser(capsys, tmp_path):
    base = make_base(tmp_path / "base", shard=None)
    agents = [make_agent(base, tmp_path / f"a{i}", 0.2, seed=i, scale=0.002) for i in range(2)]
    code, _, err = run(capsys, "merge", base, *agents, "--method", "ram", "--out", tmp_path / "m", "--quiet")
    assert code == 0 and "precision" not in err, err


def test_one_dtype_key_top_level_and_nested(capsys, tmp_path):
    """A config carrying both keys (transformers 4.56–4.57 wrote both, older ones only torch_dtype) gets one:
    `dtype`, also inside a nested config; transformers reads it back."""
    base = make_base(tmp_path / "base", shard=None)
    cfg = json.loads((base / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    cfg["text_config_like"] = {"torch_dtype": "float32", "hidden": 1}
    (base / "config.json").write_text(json.dumps(cfg))
    agents = [make_agent(base, tmp_path / f"a{i}", 0.2, seed=i, scale=0.002) for i in range(2)]
    dest = tmp_path / "m"
    code, _, err = run(capsys, "merge", base, *agents, "--method", "ram", "--out", dest, "--quiet",
                       "--out-dtype", "float32")
    assert code == 0, err
    out = json.loads((dest / "config.json").read_text())
    assert out["dtype"] == "float32" and "torch_dtype" not in out
    assert out["text_config_like"] == {"dtype": "float32", "hidden": 1}
    from transformers import AutoConfig, AutoModelForCausalLM

    assert AutoConfig.from_pretrained(dest, trust_remote_code=False).dtype == torch.float32
    assert AutoModelForCausalLM.from_pretrained(dest, dtype="auto", trust_remote_code=False).dtype == torch.float32


PROCESSOR_FILES = {
    "preprocessor_config.json": {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14,
                                 "merge_size": 2, "temporal_patch_size": 2},
    "video_preprocessor_config.json": {"video_processor_type": "Qwen2VLVideoProcessor", "patch_size": 14},
    "processor_config.json": {"processor_class": "Qwen2_5_VLProcessor"},
    "chat_template.json": {"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"},
}


@pytest.fixture
def vision_language(tmp_path):
    """A tiny Qwen2.5-VL (its transformers config, random init, save_pretrained) with the processor files a
    Hub repo of that family carries, and two sparse agents."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=160, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=32,
                           fullatt_block_indexes=[1]), vocab_size=160)
    base = tmp_path / "vl-base"
    Qwen2_5_VLForConditionalGeneration(cfg).to(torch.bfloat16).save_pretrained(base)
    for name, doc in PROCESSOR_FILES.items():
        (base / name).write_text(json.dumps(doc))
    agents = [make_agent(base, tmp_path / f"vl-{i}", 0.2, seed=i, scale=0.002) for i in range(2)]
    return base, agents


def test_vision_language_card_and_processor_files(capsys, vision_language, tmp_path):
    base, agents = vision_language
    dest = tmp_path / "vl-merged"
    code, _, err = run(capsys, "merge", base, *agents, "--method", "task_arithmetic", "--out", dest, "--quiet")
    assert code == 0, err
    card = (dest / "README.md").read_text()
    assert "pipeline_tag: image-text-to-text" in card and "AutoModelForImageTextToText" in card
    for name in PROCESSOR_FILES:
        assert (dest / name).read_bytes() == (base / name).read_bytes(), name
    merged, b = state(dest), state(base)
    for name in b:
        want = b[name].float().numpy() + sum((state(a)[name].float().numpy() - b[name].float().numpy()
                                              for a in agents), np.zeros(b[name].shape, np.float32))
        assert torch.equal(merged[name], torch.from_numpy(want).to(b[name].dtype)), name
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(dest, trust_remote_code=False)
    logits = model(input_ids=torch.tensor([[3, 5, 7]])).logits
    assert logits.shape == (1, 3, 160) and torch.isfinite(logits.float()).all()

"""Agents that may not be fine-tunes of the base get a `warning:` line naming them and what was measured, in
inspect, analyze (before the pass, and in the reading: what they do to the others' statistics) and merge;
RL-like agents get none. Tiny real Qwen2 models; the "agents from elsewhere" are another random init, a dense
SFT-like change, and agents whose config or card names another base."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from merging.reading.checkpoint import open_folder
from merging.reading.lineage import DENSE, DIFFERENT_MODEL_NORM, EPS, sample_spans, sample_update
from ram_studio.cli import main
from tests.factory import checksums, make_agent, make_base, state, write_like


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A base, two sparse RL-like agents, another random init, and a dense small change of every weight."""
    root = tmp_path_factory.mktemp("lineage")
    base = make_base(root / "base", shard=None)
    rl = [make_agent(base, root / f"rl{i}", d, seed=70 + i, scale=0.002) for i, d in enumerate((0.1, 0.3))]
    other = make_base(root / "other-init", shard=None, seed=99)
    g = torch.Generator().manual_seed(5)
    dense = write_like(base, root / "dense-sft", {n: (t.float() + torch.randn(t.shape, generator=g) * 0.003)
                                                  .to(t.dtype) for n, t in state(base).items()})
    folders = [base, *rl, other, dense]
    before = checksums(folders)
    yield base, rl, other, dense
    assert checksums(folders) == before


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: ")]


def test_rl_like_agents_get_no_warning(capsys, models):
    base, rl, _, _ = models
    code, _, err = run(capsys, "inspect", base, *rl)
    assert code == 0 and not warnings_in(err), err


def test_another_random_init_is_named_in_inspect_analyze_and_merge(capsys, models, tmp_path):
    base, rl, other, _ = models
    for argv in (["inspect"], ["analyze", "--quiet"], ["merge", "--method", "task_arithmetic", "--out",
                                                        str(tmp_path / "m"), "--quiet"]):
        code, out, err = run(capsys, argv[0], base, *rl, other, *argv[1:])
        assert code == 0, err
        found = warnings_in(err)
        assert len(found) == 1 and "agent other-init" in found[0] and "not fine-tuned from this base" in found[0]
        assert "‖τ‖/‖θ0‖" in found[0] and "density" in found[0], found
        if argv[0] == "analyze":  # the reading states what it does to the others
            text = " ".join(out.split())
            assert "Agent other-init may not be a fine-tune of this base" in text, text
            assert "of its changed elements are also changed by other-init" in text and "without other-init" in text
    recipe = json.loads((tmp_path / "m" / "ram_recipe.json").read_text())
    assert any("other-init" in n for n in recipe["notes"])


def test_a_dense_change_among_sparse_agents_is_named(capsys, models):
    base, rl, _, dense = models
    code, _, err = run(capsys, "inspect", base, *rl, dense)
    found = warnings_in(err)
    assert code == 0 and len(found) == 1 and "agent dense-sft changed almost every weight" in found[0], err


def test_the_sample_equals_an_independent_computation(models):
    """The lineage measurement is what it says: density at ε and ‖τ‖/‖θ0‖ over the documented sample."""
    base, rl, other, _ = models
    b, a = open_folder(base), open_folder(other)
    spans = sample_spans(b)
    got = sample_update(b, a, spans)
    tb, ta = state(base), state(other)
    parts = [(ta[n].float().numpy().reshape(ta[n].shape[0], -1)[s:e].ravel(),
              tb[n].float().numpy().reshape(tb[n].shape[0], -1)[s:e].ravel()) for n, s, e in spans]
    tau = np.concatenate([x - y for x, y in parts]).astype(np.float64)
    theta = np.concatenate([y for _, y in parts]).astype(np.float64)
    assert got.elements == tau.size and got.changed == int((np.abs(tau) > EPS).sum())
    assert got.rel_norm == pytest.approx(np.linalg.norm(tau) / np.linalg.norm(theta), rel=1e-9)
    assert got.density >= DENSE and got.rel_norm >= DIFFERENT_MODEL_NORM


def test_an_agent_whose_card_or_config_names_another_base(capsys, models, tmp_path):
    """A named base (its config's _name_or_path) and agents that name another one: in the card's base_model, or
    their config's _name_or_path; an agent naming the base itself is quiet."""
    base, rl, _, _ = models
    named = write_like(base, tmp_path / "Qwen2.5-7B-Instruct", state(base))
    cfg = json.loads((named / "config.json").read_text())
    cfg["_name_or_path"] = "Qwen/Qwen2.5-7B-Instruct"
    (named / "config.json").write_text(json.dumps(cfg))
    card = write_like(rl[0], tmp_path / "card-agent", state(rl[0]))
    (card / "README.md").write_text("---\nbase_model: Qwen/Qwen2.5-7B\nlicense: apache-2.0\n---\n# An agent\n")
    conf = write_like(rl[1], tmp_path / "config-agent", state(rl[1]))
    c = json.loads((conf / "config.json").read_text())
    c["_name_or_path"] = "/scratch/sft-coldstart-\x1b[31mred"
    (conf / "config.json").write_text(json.dumps(c))
    quiet = write_like(rl[1], tmp_path / "quiet-agent", state(rl[1]))
    (quiet / "README.md").write_text("---\nbase_model:\n- Qwen/Qwen2.5-7B-Instruct\n---\n")
    code, _, err = run(capsys, "inspect", named, card, conf, quiet)
    found = warnings_in(err)
    assert code == 0 and len(found) == 2, err
    assert "agent card-agent's model card base_model names 'Qwen/Qwen2.5-7B'" in found[0], found
    assert "agent config-agent's config.json _name_or_path names" in found[1] and "\x1b" not in err, found

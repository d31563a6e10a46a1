"""The app with agents as they come (Streamlit AppTest): the Models page names an agent that may not descend
from the base and says how an explicit head is read; the Merge page's vocabulary choice keeps added tokens."""
from __future__ import annotations

import json
import time

import torch
from streamlit.testing.v1 import AppTest

from tests.app_helpers import APP_MAIN, plain
from tests.factory import (
    make_agent,
    make_base,
    make_head_agent,
    make_vocab_agent,
    state,
)


def choose(at: AppTest, base, agents) -> None:
    at.switch_page("views/models.py").run()
    at.radio(key="model_source").set_value("Custom: local folders or Hub ids").run()
    at.text_input(key="custom_base").set_value(str(base)).run()
    at.text_area(key="custom_agents").set_value("\n".join(map(str, agents))).run()


def test_models_page_names_an_agent_from_another_base_and_reads_heads(env, tmp_path):
    base = make_base(tmp_path / "base", shard=None, tie=True)
    rl = make_agent(base, tmp_path / "rl", 0.1, seed=1, scale=0.002)
    head = make_head_agent(base, tmp_path / "explicit-head", seed=2)
    other = make_base(tmp_path / "other-init", shard=None, seed=9, tie=True)
    at = AppTest.from_file(str(APP_MAIN), default_timeout=120)
    choose(at, base, [rl, head, other])
    assert not at.exception and not at.error, [plain(e.value) for e in at.error]
    warnings = [plain(w.value) for w in at.warning]
    assert any("warning:" in w and "agent other-init" in w and "not fine-tuned from this base" in w for w in warnings)
    assert not any("agent rl " in w or "agent explicit-head" in w for w in warnings), warnings
    assert any("treated as tied" in plain(c.value) for c in at.caption)
    assert any("Compatible" in plain(s.value) for s in at.success)  # the equal head is no difference


def wait_merge(at: AppTest, seconds: float = 240) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        at.run()
        if not at.button(key="start_merge").disabled and (at.success or at.error):
            return
        time.sleep(0.3)
    raise AssertionError("merge did not finish in time")


def test_merge_page_vocabulary_union_keeps_added_tokens(env, tmp_path):
    base = make_base(tmp_path / "base", shard=None, tie=True)
    agents = [make_vocab_agent(base, tmp_path / "think", ["<think>", "</think>"], seed=10),
              make_agent(base, tmp_path / "plain", 0.1, seed=11, scale=0.002)]
    at = AppTest.from_file(str(APP_MAIN), default_timeout=120)
    choose(at, base, agents)
    assert any("--vocab union" in plain(w.value) and "<think>" in plain(w.value) for w in at.warning)
    at.button(key="use_models").click().run()
    at.switch_page("views/merge.py").run()
    at.selectbox(key="merge_method").set_value("task_arithmetic").run()
    assert at.radio(key="merge_vocab").value == "base" and at.checkbox(key="merge_untie").value is False
    before = at.text_input(key="merge_out").value
    at.radio(key="merge_vocab").set_value("union").run()
    assert at.text_input(key="merge_out").value != before  # another merge, another suggested folder
    out = tmp_path / "merged" / "union"
    at.text_input(key="merge_out").set_value(str(out)).run()
    at.button(key="start_merge").click().run()
    wait_merge(at)
    assert not at.exception and not at.error, [plain(e.value) for e in at.error]
    merged = state(out)
    assert merged["model.embed_tokens.weight"].shape[0] == 98
    assert torch.equal(merged["model.embed_tokens.weight"][96], state(agents[0])["model.embed_tokens.weight"][96])
    folder = out
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == 98
    assert json.loads((folder / "ram_recipe.json").read_text())["spec"]["vocab"] == "union"

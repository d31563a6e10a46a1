"""The model card's front matter lists only Hugging Face repo ids as base_model (issue 13)."""
from __future__ import annotations

import yaml

from merging.model_card import hub_ids, render_card
from merging.recipe import MergeSpec


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n", 2)[1])


def test_hub_ids_only(tmp_path):
    local = tmp_path / "my-agent"
    local.mkdir()
    refs = ["Qwen/Qwen2.5-7B-Instruct@main", "demo:code", str(local), "org/agent-b", "Qwen/Qwen2.5-7B-Instruct",
            "not a ref at all/../x"]
    assert hub_ids(refs) == ["Qwen/Qwen2.5-7B-Instruct", "org/agent-b"]


def test_card_front_matter_lists_hub_parents(tmp_path):
    spec = MergeSpec("Qwen/Qwen2.5-7B-Instruct", ["org/coder@abc123", str(tmp_path), "demo:tool"], "ram", {"eps": 1e-5},
                     "out")
    meta = front_matter(render_card(spec, ["coder", "x", "tool"], None, "{}", []))
    assert meta["base_model"] == ["Qwen/Qwen2.5-7B-Instruct", "org/coder"]
    assert meta["base_model_relation"] == "merge"
    assert meta["library_name"] == "transformers" and meta["tags"] == ["merge", "ram", "ram"]


def test_card_without_hub_parents_has_no_base_model():
    spec = MergeSpec("demo:base", ["demo:code", "demo:tool"], "average", {}, "out")
    card = render_card(spec, ["code", "tool"], None, "{}", [])
    meta = front_matter(card)
    assert "base_model" not in meta and "base_model_relation" not in meta
    assert meta["tags"] == ["merge", "ram", "average"]
    assert "`demo:code`" in card  # the body still names every input

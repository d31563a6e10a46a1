"""The model card: Hub metadata through huggingface_hub's ModelCard / ModelCardData, base_model lists only Hugging Face
repo ids, and every file-derived text in the body is escaped (the Markdown rules of docs/security.md)."""
from __future__ import annotations

import pytest
from huggingface_hub import ModelCard, ModelCardData

from merging.recipe import MergeSpec
from merging.writing.model_card import check_card_metadata, hub_ids, render_card


def load(card: str, tmp_path) -> ModelCard:
    """The card as the Hub client reads a README.md (metadata errors not ignored), after our own checks."""
    path = tmp_path / "README.md"
    path.write_text(card)
    check_card_metadata(card)
    return ModelCard.load(path, ignore_metadata_errors=False)


def test_hub_ids_only(tmp_path):
    local = tmp_path / "my-agent"
    local.mkdir()
    refs = ["Qwen/Qwen2.5-7B-Instruct@main", "demo:code", str(local), "org/agent-b", "Qwen/Qwen2.5-7B-Instruct",
            "not a ref at all/../x"]
    assert hub_ids(refs) == ["Qwen/Qwen2.5-7B-Instruct", "org/agent-b"]


def test_card_front_matter_lists_hub_parents(tmp_path):
    spec = MergeSpec("Qwen/Qwen2.5-7B-Instruct", ["org/coder@abc123", str(tmp_path), "demo:tool"], "ram", {"eps": 1e-5},
                     "out")
    card = load(render_card(spec, ["coder", "x", "tool"], None, "{}", []), tmp_path)
    assert isinstance(card.data, ModelCardData)
    meta = card.data.to_dict()
    assert meta["base_model"] == ["Qwen/Qwen2.5-7B-Instruct", "org/coder"]
    assert meta["base_model_relation"] == "merge"
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-generation"
    assert meta["tags"] == ["merge", "ram"]  # the Hub's tags are a set: "ram" once
    assert "# Merged model (ram)" in card.text


def test_card_without_hub_parents_has_no_base_model(tmp_path):
    spec = MergeSpec("demo:base", ["demo:code", "demo:tool"], "average", {}, "out")
    card = render_card(spec, ["code", "tool"], None, "{}", [])
    meta = load(card, tmp_path).data.to_dict()
    assert "base_model" not in meta and "base_model_relation" not in meta
    assert meta["tags"] == ["merge", "ram", "average"]
    assert "` demo:code `" in card  # the body still names every input


@pytest.mark.parametrize("bad, why", [
    ("base_model: [../etc/passwd]\nbase_model_relation: merge\n", "not a Hub repo id"),
    ("base_model: [org/a]\nbase_model_relation: blend\n", "base_model_relation"),
    ("base_model_relation: merge\n", "base_model_relation"),
    ("tags: [1, {a: b}]\n", "tags"),
    ("model-index: [{results: 3}]\n", "model_index"),
])
def test_metadata_check_refuses_what_the_hub_would(bad, why):
    with pytest.raises(ValueError, match=why):
        check_card_metadata(f"---\n{bad}---\n\n# x\n")


def test_file_derived_text_in_the_card_is_escaped(tmp_path):
    """Agent labels, references, parameter values, notes, the mergekit text and the recipe come from files or
    users: none of it can make a link, an image, HTML, a table cell, a heading, close a code block, or run as a
    template."""
    evil = "x](http://evil.example)<img src=x onerror=alert(1)>|{{ 7*7 }}\x1b[31m"
    spec = MergeSpec("org/base", ["org/a", "org/b"], "unique_only", {"agent": evil}, "out")
    recipe = '{"agents": ["```\\n# not a heading"]}'
    card = render_card(spec, [evil, "b"], [{"agent": evil, "shared": 1, "unique": 2, "rho": 0.5, "lambda": 1.2}],
                       recipe + "\n```\n## injected", [f"tensor {evil} skipped"], ("models:\n- model: ```evil", ""))
    body = load(card, tmp_path).text
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(body)
    kinds = {t.type for t in tokens} | {c.type for t in tokens for c in t.children or []}
    assert not kinds & {"link_open", "image", "html_inline", "html_block", "em_open", "strong_open"}, kinds
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert "injected" not in headings and "not a heading" not in headings, headings
    fences = [t for t in tokens if t.type == "fence"]
    assert [f.info for f in fences] == ["yaml", "python", "json"]  # the mergekit and recipe text stayed inside
    assert "## injected" in fences[2].content and "```evil" in fences[0].content
    cells: list[int] = []
    for t in tokens:  # cells per table row: a '|' in a name never adds a column
        if t.type == "tr_open":
            cells.append(0)
        elif t.type in ("td_open", "th_open"):
            cells[-1] += 1
    assert cells == [2, 2, 2, 5, 5], cells
    text = "".join(c.content for t in tokens if t.type == "inline" for c in t.children or [] if c.type == "text")
    assert "{{ 7*7 }}" in text and "49" not in text  # shown as written: no template ever ran over the body
    assert "\\x1b[31m" in text and "\x1b" not in card  # control characters escaped, shown as \\x1b

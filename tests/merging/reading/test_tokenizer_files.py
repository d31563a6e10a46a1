"""Tokenizer files are untrusted input: bounded parsing with one clear error per malformed file, and what an
agent's tokenizer adds to the base's (merging/reading/tokenizer_files.py, merging/reading/vocab_files.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from merging.common.errors import RamStudioError
from merging.reading import tokenizer_files as tf
from merging.reading.tokenizer_files import compare, describe_tokens, parse_tokenizer
from merging.reading.vocab_files import union_files


def doc(vocab=None, added=(), model_type="BPE", merges=("a b",)) -> dict:
    return {"version": "1.0", "added_tokens": [dict(e) for e in added],
            "model": {"type": model_type, "vocab": vocab if vocab is not None else {"a": 0, "b": 1, "ab": 2},
                      "merges": list(merges)}}


def entry(i: int, content: str, special: bool = False) -> dict:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": not special, "special": special}


def parsed(d: dict, where: Path = Path("/m")) -> tf.TokenizerFile:
    return parse_tokenizer(where, json.dumps(d).encode())


BASE = doc(added=[entry(3, "<pad>", True)])


@pytest.mark.parametrize("raw,fragment", [
    (b"{not json", "is not valid JSON"),
    (b"[1, 2]", "no vocabulary model"),
    (("[" * 100_000 + "]" * 100_000).encode(), "nested more than"),
    (json.dumps(doc(added=[{"id": "7", "content": "x"}])).encode(), "integer id"),
    (json.dumps(doc(added=[{"id": -1, "content": "x"}])).encode(), "integer id"),
    (json.dumps(doc(added=[{"id": 1 << 50, "content": "x"}])).encode(), "integer id"),
    (json.dumps(doc(added=[{"id": 5, "content": ""}])).encode(), "text content"),
    (json.dumps(doc(added=[entry(5, "x"), entry(5, "y")])).encode(), "twice"),
    (json.dumps(doc(vocab={"a": "zero"})).encode(), "integer ids"),
    (json.dumps(doc(vocab=[["a", 0.0], [1, 2]], model_type="Unigram")).encode(), "Unigram"),
    (json.dumps({**doc(), "added_tokens": {"id": 1}}).encode(), "added_tokens"),
])
def test_malformed_tokenizers_are_one_clear_error(raw, fragment):
    with pytest.raises(RamStudioError) as info:
        parse_tokenizer(Path("/models/agent"), raw)
    assert fragment in info.value.message and "/models/agent/tokenizer.json" in info.value.message
    assert info.value.hint


def test_added_token_count_is_bounded(monkeypatch):
    monkeypatch.setattr(tf, "MAX_ADDED_TOKENS", 3)
    with pytest.raises(RamStudioError, match="at most 3"):
        parsed(doc(added=[entry(10 + i, f"<t{i}>") for i in range(4)]))


def test_an_extension_adds_tokens_after_the_base():
    agent = parsed(doc(added=[entry(3, "<pad>", True), entry(4, "<think>"), entry(5, "<tool_call>", True)]))
    ext = compare(parsed(BASE), agent, "agent")
    assert ext.problem is None and ext.added == {4: "<think>", 5: "<tool_call>"}
    assert compare(parsed(BASE), parsed(BASE), "same").added == {}


def test_merges_written_either_way_are_the_same_model():
    pairs = parsed(doc(merges=[["a", "b"]], added=[entry(3, "<pad>", True), entry(4, "<x>")]))
    assert compare(parsed(BASE), pairs, "agent").problem is None


@pytest.mark.parametrize("agent,fragment", [
    (doc(vocab={"a": 0, "b": 1, "ba": 2}, added=[entry(3, "<pad>", True)]), "vocabulary model differs"),
    (doc(added=[entry(3, "<other>")]), "base token id 3"),
    (doc(added=[]), "is absent"),
    (doc(added=[entry(3, "<pad>", True), entry(4, "ab")]), "a token the base has at id 2"),
    (doc(added=[entry(3, "<pad>", True), entry(1, "<new>")]), "an id the base uses"),
])
def test_what_is_not_an_extension_is_said(agent, fragment):
    ext = compare(parsed(BASE), parsed(agent), "agent")
    assert ext.added == {} and fragment in ext.problem


def test_token_text_is_escaped_and_listed_briefly():
    added = {10 + i: f"<t{i}>" for i in range(8)}
    added[9] = "\x1b[31m<red>\u202e"
    text = describe_tokens(added)
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b" in text
    assert text.startswith("9 tokens") and "and 4 more" in text


def test_union_files_append_tokens_where_the_base_records_its_own(tmp_path):
    base = tmp_path / "base"
    agent = tmp_path / "agent"
    for folder in (base, agent):
        folder.mkdir()
    (base / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": {"3": {"content": "<pad>", "special": True}},
        "additional_special_tokens": ["<pad>"], "model_max_length": 64}))
    (base / "added_tokens.json").write_text(json.dumps({"<pad>": 3}))
    (agent / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": {"5": {"content": "<tool_call>", "special": True, "lstrip": False}},
        "additional_special_tokens": ["<pad>", "<tool_call>", "<not-added>"]}))
    files = union_files(base, parsed(BASE), {4: entry(4, "<think>"), 5: entry(5, "<tool_call>", True)}, [agent])
    tok = json.loads(files["tokenizer.json"])
    assert [(e["id"], e["content"]) for e in tok["added_tokens"]] == [(3, "<pad>"), (4, "<think>"), (5, "<tool_call>")]
    cfg = json.loads(files["tokenizer_config.json"])
    assert cfg["added_tokens_decoder"]["5"] == {"content": "<tool_call>", "special": True, "lstrip": False}
    assert cfg["added_tokens_decoder"]["4"]["content"] == "<think>" and cfg["model_max_length"] == 64
    assert cfg["additional_special_tokens"] == ["<pad>", "<tool_call>"]  # tokens the union does not add stay out
    assert json.loads(files["added_tokens.json"]) == {"<pad>": 3, "<think>": 4, "<tool_call>": 5}

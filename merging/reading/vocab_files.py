"""The union tokenizer's files: the base's tokenizer.json with every agent's added tokens appended at their
ids, and the same tokens recorded where the base's tokenizer_config.json (added_tokens_decoder, the lists of
extra special tokens), added_tokens.json and special_tokens_map.json record theirs. Each agent's files are
read under the same bounds as any tokenizer file (merging/reading/tokenizer_files.py)."""
from __future__ import annotations

import json
from pathlib import Path

from merging.reading.model_folder import read_json_object
from merging.reading.tokenizer_files import TOKENIZER_CONFIG, TOKENIZER_FILE, TokenizerFile

SPECIAL_LISTS = ("extra_special_tokens", "additional_special_tokens")
DECODER_FIELDS = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")


def _dump(doc: object) -> bytes:
    return (json.dumps(doc, ensure_ascii=False, indent=2) + "\n").encode("utf-8")


def _decoder_entry(entry: dict, agent_cfg: dict | None, token_id: int) -> dict:
    """A tokenizer_config `added_tokens_decoder` entry for an added token: the agent's own when it has one for
    this id and content, else the fields of its tokenizer.json entry."""
    theirs = ((agent_cfg or {}).get("added_tokens_decoder") or {})
    mine = theirs.get(str(token_id)) if isinstance(theirs, dict) else None
    if isinstance(mine, dict) and mine.get("content") == entry["content"]:
        return {k: mine[k] for k in DECODER_FIELDS if k in mine and isinstance(mine[k], (str, bool))}
    return {k: entry[k] for k in DECODER_FIELDS if k in entry and isinstance(entry[k], (str, bool))}


def _union_list(base_list: object, agent_lists: list[object], contents: set[str]) -> list | None:
    """The base's list of special tokens plus the agents' entries that are added tokens (in order, once)."""
    out = list(base_list) if isinstance(base_list, list) else []
    for lst in agent_lists:
        for t in lst if isinstance(lst, list) else []:
            content = t.get("content") if isinstance(t, dict) else t  # transformers 4 may write AddedToken dicts
            if isinstance(content, str) and content in contents and t not in out:
                out.append(t)
    return out if out or isinstance(base_list, list) else None


def union_files(base_folder: Path, base_tok: TokenizerFile, entries: dict[int, dict],
                adder_folders: list[Path]) -> dict[str, bytes]:
    """The files the union tokenizer replaces in the output (name → bytes): `entries` are the added tokens'
    tokenizer.json entries by id (from the agent that added each; the first where several did)."""
    doc = dict(base_tok.doc)
    doc["added_tokens"] = sorted([*base_tok.added.values(), *entries.values()], key=lambda e: e["id"])
    files = {TOKENIZER_FILE: _dump(doc)}
    contents = {e["content"] for e in entries.values()}
    agent_cfgs = [read_json_object(f, TOKENIZER_CONFIG, "tokenizer config") or {} for f in adder_folders]
    cfg = read_json_object(base_folder, TOKENIZER_CONFIG, "tokenizer config")
    if cfg is not None:
        cfg = dict(cfg)
        if isinstance(cfg.get("added_tokens_decoder"), dict):
            decoder = dict(cfg["added_tokens_decoder"])
            for i, e in sorted(entries.items()):
                source = next((c for c in agent_cfgs if str(i) in (c.get("added_tokens_decoder") or {})), None)
                decoder[str(i)] = _decoder_entry(e, source, i)
            cfg["added_tokens_decoder"] = decoder
        for key in SPECIAL_LISTS:
            merged = _union_list(cfg.get(key), [c.get(key) for c in agent_cfgs], contents)
            if merged is not None:
                cfg[key] = merged
        files[TOKENIZER_CONFIG] = _dump(cfg)
    legacy = read_json_object(base_folder, "added_tokens.json", "added tokens file")
    if legacy is not None:
        files["added_tokens.json"] = _dump({**legacy, **{e["content"]: i for i, e in sorted(entries.items())}})
    special = read_json_object(base_folder, "special_tokens_map.json", "special tokens map")
    if special is not None and isinstance(special.get("additional_special_tokens"), list):
        theirs = [(read_json_object(f, "special_tokens_map.json", "special tokens map") or {})
                  .get("additional_special_tokens") for f in adder_folders]
        lists = theirs + [c.get(k) for c in agent_cfgs for k in SPECIAL_LISTS]
        special = {**special, "additional_special_tokens": _union_list(
            special["additional_special_tokens"], lists, contents)}
        files["special_tokens_map.json"] = _dump(special)
    return files

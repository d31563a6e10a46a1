"""Tokenizer files read as untrusted data: `tokenizer.json` (and `tokenizer_config.json`) of a model folder,
bounded in size, nesting and entry count, with every field type-checked before it is used.

What a merge needs from a tokenizer is its map of token ids: the vocabulary model's (`model.vocab`, with
`model.merges` for BPE) and the added tokens (`added_tokens`). An agent's tokenizer *extends* the base's when
its vocabulary model is the base's, every base added token keeps its id and content, and every other added
token is new (a content the base does not have, at an id the base does not use).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from merging.common.errors import RamStudioError, printable
from merging.common.untrusted import TooComplex, loads_json
from merging.reading.model_folder import MAX_SMALL_FILE, check_file, open_checked

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
MAX_ADDED_TOKENS = 1_000_000  # real tokenizers add up to a few thousand
MAX_TOKEN_CHARS = 4096
MAX_TOKEN_ID = 1 << 40


@dataclass
class TokenizerFile:
    """A parsed tokenizer.json: the raw bytes, the document, and its added tokens by id."""

    raw: bytes
    doc: dict
    added: dict[int, dict] = field(default_factory=dict)  # id → the added_tokens entry

    def base_ids(self) -> dict[str, int]:
        """Every token's id: the vocabulary model's and the added tokens'."""
        ids = dict(_model_vocab(self.doc))
        ids.update({e["content"]: i for i, e in self.added.items()})
        return ids


def read_raw(folder: Path, name: str) -> bytes | None:
    """A small file of a model folder under the containment rule (None when absent)."""
    try:
        ident = check_file(folder, name, max_bytes=MAX_SMALL_FILE)
    except FileNotFoundError:
        return None
    try:
        with open_checked(ident) as f:
            return f.read(MAX_SMALL_FILE + 1)
    except OSError as exc:
        raise RamStudioError(f"cannot read {Path(folder) / name}: {exc.strerror or exc}.") from None


def parse_tokenizer(folder: Path, raw: bytes) -> TokenizerFile:
    """Parse and check a tokenizer.json's bytes; anything malformed is one clear error naming the file."""
    shown = Path(folder) / TOKENIZER_FILE

    def bad(what: str) -> RamStudioError:
        return RamStudioError(f"{shown} {what}.", "Fix or re-download the tokenizer.")

    try:
        doc = loads_json(raw.decode("utf-8"))
    except TooComplex as exc:
        raise bad(exc.reason) from None
    except (UnicodeDecodeError, ValueError):
        raise bad("is not valid JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise bad("has no vocabulary model (no 'model' object)")
    entries = doc.get("added_tokens", [])
    if not isinstance(entries, list) or len(entries) > MAX_ADDED_TOKENS:
        raise bad(f"has an 'added_tokens' that is not a list of at most {MAX_ADDED_TOKENS:,} entries")
    added: dict[int, dict] = {}
    for e in entries:
        if not (isinstance(e, dict) and type(e.get("id")) is int and 0 <= e["id"] < MAX_TOKEN_ID
                and isinstance(e.get("content"), str) and 0 < len(e["content"]) <= MAX_TOKEN_CHARS):
            raise bad("has an added token without an integer id and a text content")
        if e["id"] in added:
            raise bad(f"lists added token id {e['id']} twice")
        added[e["id"]] = e
    try:
        _model_vocab(doc)
    except ValueError as exc:
        raise bad(str(exc)) from None
    return TokenizerFile(raw, doc, added)


def _model_vocab(doc: dict) -> dict[str, int]:
    """The vocabulary model's token → id (a dict for BPE/WordPiece/WordLevel, a list for Unigram)."""
    vocab = doc["model"].get("vocab", {})
    if isinstance(vocab, dict):
        if not all(isinstance(k, str) and type(v) is int for k, v in vocab.items()):
            raise ValueError("has a vocabulary that does not map tokens to integer ids")
        return vocab
    if isinstance(vocab, list):
        if not all(isinstance(x, list) and x and isinstance(x[0], str) for x in vocab):
            raise ValueError("has a Unigram vocabulary that is not a list of [token, score]")
        return {x[0]: i for i, x in enumerate(vocab)}
    raise ValueError("has a vocabulary that is neither an object nor a list")


def _model_key(doc: dict) -> dict:
    """The vocabulary model with BPE merges in one form (tokenizers writes "a b" or ["a", "b"])."""
    model = dict(doc["model"])
    merges = model.get("merges")
    if isinstance(merges, list):
        model["merges"] = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) if isinstance(m, list) else m
                           for m in merges]
    return model


@dataclass(frozen=True)
class Extension:
    """How one agent's tokenizer relates to the base's: the tokens it adds (id → content, and their entries),
    or why it is not an extension (`problem`)."""

    agent: str
    added: dict[int, str]
    entries: dict[int, dict]
    problem: str | None = None


def compare(base: TokenizerFile, agent: TokenizerFile, label: str) -> Extension:
    """Whether `agent` extends `base`, and with which tokens."""
    if agent.raw == base.raw:
        return Extension(label, {}, {})
    if _model_key(agent.doc) != _model_key(base.doc):
        return Extension(label, {}, {}, "its tokenizer's vocabulary model differs from the base's (not only "
                                         "added tokens)")
    for i, e in base.added.items():
        mine = agent.added.get(i)
        if mine is None or mine["content"] != e["content"]:
            now = "absent" if mine is None else repr(printable(mine["content"], 40))
            return Extension(label, {}, {}, f"base token id {i} ({printable(e['content'], 40)!r}) is {now} in its "
                                            "tokenizer")
    ids = base.base_ids()
    used = set(ids.values())
    new = {i: e for i, e in agent.added.items() if i not in base.added}
    for i, e in sorted(new.items()):
        if e["content"] in ids:
            return Extension(label, {}, {}, f"it adds {printable(e['content'], 40)!r} at id {i}, a token the base "
                                            f"has at id {ids[e['content']]}")
        if i in used:
            return Extension(label, {}, {}, f"it adds {printable(e['content'], 40)!r} at id {i}, an id the base "
                                            "uses")
    return Extension(label, {i: e["content"] for i, e in new.items()}, new)


def describe_tokens(added: dict[int, str], limit: int = 5) -> str:
    """'2 tokens: id 96 '<think>', id 97 '</think>'' (the first few, escaped)."""
    shown = ", ".join(f"id {i} {printable(t, 40)!r}" for i, t in sorted(added.items())[:limit])
    more = f" and {len(added) - limit:,} more" if len(added) > limit else ""
    return f"{len(added):,} token{'s' if len(added) != 1 else ''} ({shown}{more})"

"""Added tokens: agents whose tokenizer extends the base's (`<think>`, `<tool_call>`…), and the union vocabulary.

Without `--vocab union`, an agent that adds tokens is refused, naming the tokens and the option (under
`--on-mismatch base` the tokens are dropped, said so). With it, when every agent's tokenizer extends the base's
and no two agents give one id to different tokens (or one token different ids):

- the base's rows of the embeddings (and of an untied head) are merged as usual;
- each added token's row is the row of the agent that added it, averaged (float32 sum / count) where several
  agents added the same token at the same id; an added id inside the base's rows (a vocabulary padded beyond
  its tokenizer) replaces the merged row there;
- rows past the base's that hold no added token (an agent's padding) are averaged over the agents that have them;
- the output holds max(base rows, largest added id + 1) rows, config `vocab_size` says so, and the union
  tokenizer (merging/reading/vocab_files.py) is written instead of the base's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from merging.common.errors import RamStudioError, printable
from merging.reading.checkpoint import Checkpoint
from merging.reading.heads import embedding_name, head_name
from merging.reading.tokenizer_files import (
    TOKENIZER_FILE,
    Extension,
    TokenizerFile,
    compare,
    describe_tokens,
    parse_tokenizer,
    read_raw,
)

VOCAB_CHOICES = ("base", "union")
VOCAB_HELP = ("base: the output keeps the base's vocabulary and tokenizer (an agent that adds tokens is refused "
              "unless --on-mismatch base drops them). union: when every agent's tokenizer extends the base's, the "
              "output keeps every added token: its rows from the agent(s) that added it, and the union tokenizer")


@dataclass
class VocabPlan:
    """What `--vocab union` writes: `rows` rows (the base has `base_rows`) in `tensors`; each row in `sources`
    is the mean of those agents' rows (by index); `added` the union's added tokens; `files` its tokenizer."""

    tensors: tuple[str, ...]
    base_rows: int
    rows: int
    sources: dict[int, tuple[int, ...]]
    added: dict[int, str]
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class VocabOutcome:
    """The tokenizers compared (per agent, None without a tokenizer.json), the plan when there is one, notes,
    and the (agent, tensor) row differences the plan resolves."""

    extensions: list[Extension | None]
    plan: VocabPlan | None = None
    notes: list[str] = field(default_factory=list)
    handled: set[tuple[str, str]] = field(default_factory=set)
    refusal: RamStudioError | None = None  # raised when the report is enforced (inspect shows everything first)


def compare_tokenizers(base: Checkpoint, agents: list[Checkpoint], labels: list[str], strict: bool = True,
                       notes: list[str] | None = None) -> list[Extension | None]:
    """Each agent's tokenizer.json against the base's (identical bytes are not parsed). A tokenizer that cannot
    be parsed is an error when `strict`, else that agent is not compared (None) and a note says so."""
    base_raw = read_raw(base.folder, TOKENIZER_FILE)
    if base_raw is None:
        return [None] * len(agents)
    parsed: TokenizerFile | None = None
    out: list[Extension | None] = []
    for agent, label in zip(agents, labels):
        raw = read_raw(agent.folder, TOKENIZER_FILE)
        if raw is None:
            out.append(None)
        elif raw == base_raw:
            out.append(Extension(label, {}, {}))
        else:
            try:
                parsed = parsed or parse_tokenizer(base.folder, base_raw)
                out.append(compare(parsed, parse_tokenizer(agent.folder, raw), label))
            except RamStudioError as exc:
                if strict:
                    raise
                out.append(None)
                if notes is not None:
                    notes.append(f"{label}'s tokenizer was not compared with the base's ({exc.message}): tokens it "
                                 "may add are not checked.")
    return out


def vocab_tensors(base: Checkpoint) -> tuple[str, ...]:
    """The tensors whose rows are token ids: the embeddings, and the head when the model has one of its own."""
    embed = embedding_name(base)
    if embed is None:
        return ()
    head = head_name(base)
    rows = base.tensors[embed].shape[0]
    return (embed,) + ((head,) if head and base.tensors[head].shape[:1] == (rows,) else ())


def plan_vocabulary(base: Checkpoint, agents: list[Checkpoint], labels: list[str], choice: str,
                    policy: str) -> VocabOutcome:
    """Compare the tokenizers and decide: refuse (naming the tokens and the options), drop (under
    --on-mismatch base, noted) or plan the union (`choice` 'union')."""
    if choice not in VOCAB_CHOICES:
        raise RamStudioError(f"unknown vocabulary choice {choice!r}.", f"Use one of {', '.join(VOCAB_CHOICES)}.")
    notes: list[str] = []
    outcome = VocabOutcome(compare_tokenizers(base, agents, labels, strict=choice == "union", notes=notes), notes=notes)
    adders = [e for e in outcome.extensions if e is not None and e.added]
    problems = [e for e in outcome.extensions if e is not None and e.problem]
    if choice == "base":
        if adders or problems:
            _refuse_or_drop(outcome, adders, problems, policy)
        return outcome
    if problems:
        raise RamStudioError(f"--vocab union: agent {problems[0].agent}'s tokenizer does not extend the base's: "
                             f"{problems[0].problem}.",
                             "Every agent's tokenizer must be the base's with tokens appended; --on-mismatch base "
                             "keeps the base's vocabulary instead.")
    tensors = vocab_tensors(base)
    if not tensors:
        raise RamStudioError("--vocab union: the base has no input embedding tensor (…embed_tokens.weight).",
                             "Added tokens can only be kept for a model whose embeddings are recognised.")
    _refuse_unknown_rows(base, agents, labels, outcome.extensions, tensors)
    if not adders:
        outcome.notes.append("--vocab union: no agent adds tokens to the base's tokenizer; the base's vocabulary "
                             "is kept.")
        return outcome
    outcome.plan = _union(base, agents, labels, outcome.extensions, tensors)
    outcome.handled = {(label, t) for a, label in zip(agents, labels) for t in tensors
                       if t in a.tensors and a.tensors[t].shape[:1] != base.tensors[t].shape[:1]}
    plan = outcome.plan
    for e in adders:
        outcome.notes.append(f"--vocab union: {e.agent} adds {describe_tokens(e.added)}; kept, with its rows.")
    outcome.notes.append(f"--vocab union: {plan.rows:,} vocabulary rows (the base has {plan.base_rows:,}); "
                         f"{len(plan.added):,} added token(s) in the union tokenizer.")
    return outcome


def _refuse_or_drop(outcome: VocabOutcome, adders: list[Extension], problems: list[Extension], policy: str) -> None:
    parts = [f"agent {e.agent} adds {describe_tokens(e.added)} to the base's tokenizer" for e in adders]
    parts += [f"agent {e.agent}'s tokenizer differs from the base's: {e.problem}" for e in problems]
    if policy != "base":
        fix = ("Merge with --vocab union to keep them (their rows and the union tokenizer), or pass "
               "--on-mismatch base to drop them (the base's vocabulary and tokenizer; an analysis then covers the "
               "base's rows only).") if adders and not problems else (
               "Check that every agent was fine-tuned from this base with its tokenizer; --on-mismatch base keeps "
               "the base's vocabulary and tokenizer.")
        outcome.refusal = RamStudioError("; ".join(parts) + ".", fix)
        return
    for part in parts:
        outcome.notes.append(f"{part}: dropped (--on-mismatch base keeps the base's vocabulary and tokenizer; "
                             "--vocab union keeps added tokens).")


def _rows(ckpt: Checkpoint, tensor: str) -> int:
    e = ckpt.tensors.get(tensor)
    return e.shape[0] if e is not None and e.shape else 0


def _refuse_unknown_rows(base: Checkpoint, agents: list[Checkpoint], labels: list[str],
                         extensions: list[Extension | None], tensors: tuple[str, ...]) -> None:
    """Extra rows whose tokens cannot be known (no tokenizer.json to compare) are refused."""
    for agent, label, ext in zip(agents, labels, extensions):
        extra = max(_rows(agent, t) - _rows(base, t) for t in tensors)
        if extra > 0 and ext is None:
            where = "the base" if read_raw(base.folder, TOKENIZER_FILE) is None else label
            raise RamStudioError(f"--vocab union: {label} has {extra:,} more vocabulary rows than the base, and "
                                 f"{where} has no tokenizer.json to say which tokens they hold.",
                                 "Add the tokenizer files the model was trained with, or use --on-mismatch base to "
                                 "drop those rows.")


def _union(base: Checkpoint, agents: list[Checkpoint], labels: list[str], extensions: list[Extension | None],
           tensors: tuple[str, ...]) -> VocabPlan:
    """The union's rows and sources; conflicting additions are refused with their ids."""
    by_id: dict[int, tuple[str, list[int]]] = {}
    by_token: dict[str, int] = {}
    entries: dict[int, dict] = {}
    for k, ext in enumerate(extensions):
        for i, token in sorted((ext.added if ext else {}).items()):
            held = min(_rows(agents[k], t) for t in tensors)
            if i >= held:
                raise RamStudioError(f"--vocab union: {labels[k]}'s tokenizer has {printable(token, 40)!r} at id "
                                     f"{i:,}, but its vocabulary tensors have {held:,} rows.",
                                     "Its tokenizer and weights do not belong together; re-export the agent.")
            if i in by_id and by_id[i][0] != token:
                first = labels[by_id[i][1][0]]
                raise RamStudioError(f"--vocab union: conflicting added tokens at id {i:,}: {first} adds "
                                     f"{printable(by_id[i][0], 40)!r}, {labels[k]} adds {printable(token, 40)!r}.",
                                     "Agents must give each new token the same id; merge agents that agree, or use "
                                     "--on-mismatch base to drop the added tokens.")
            if by_token.get(token, i) != i:
                raise RamStudioError(f"--vocab union: {printable(token, 40)!r} is added at id {by_token[token]:,} by "
                                     f"{labels[by_id[by_token[token]][1][0]]} and at id {i:,} by {labels[k]}.",
                                     "Agents must give each new token the same id; merge agents that agree, or use "
                                     "--on-mismatch base to drop the added tokens.")
            by_id.setdefault(i, (token, []))[1].append(k)
            by_token[token] = i
            entries.setdefault(i, ext.entries[i])
    base_rows = _rows(base, tensors[0])
    rows = max(base_rows, max(by_id) + 1)
    sources = {i: tuple(ks) for i, (_token, ks) in by_id.items()}
    for r in range(base_rows, rows):
        if r not in sources:  # padding rows of an agent past the base's: their mean
            sources[r] = tuple(k for k, a in enumerate(agents) if min(_rows(a, t) for t in tensors) > r)
    from merging.reading.vocab_files import union_files

    adder_folders = [agents[k].folder for k in sorted({k for _token, ks in by_id.values() for k in ks})]
    base_tok = parse_tokenizer(base.folder, read_raw(base.folder, TOKENIZER_FILE) or b"{}")
    return VocabPlan(tensors, base_rows, rows, dict(sorted(sources.items())), {i: t for i, (t, _k) in by_id.items()},
                     union_files(base.folder, base_tok, entries, adder_folders))


def with_vocab_size(config: dict, base_rows: int, rows: int) -> dict:
    """A copy of a config whose `vocab_size` (top level, or the text model's) says `rows` where it said
    `base_rows` (or is the only one given)."""
    cfg = dict(config)
    if isinstance(cfg.get("vocab_size"), int):
        cfg["vocab_size"] = rows
    text = cfg.get("text_config")
    if isinstance(text, dict) and isinstance(text.get("vocab_size"), int) and text["vocab_size"] in (base_rows, rows):
        cfg["text_config"] = {**text, "vocab_size": rows}
    return cfg

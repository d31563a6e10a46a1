"""Tied output heads: a base whose `lm_head` is its input embeddings (`tie_word_embeddings: true`, no head
tensor on disk) and agents saved with an explicit head.

Some exports write an explicit `lm_head.weight` equal to the embeddings (and `tie_word_embeddings: false`):
such an agent is still tied, and its head is ignored. An agent whose head differs from its embeddings was
untied by training: a merge that keeps the base's tie drops that head update (said so), and `--untie` writes
an untied head instead — the base's embeddings as its θ0, each agent's head (its embeddings where it is tied)
as θ_t, merged like any tensor — with `tie_word_embeddings: false` in the output's config.

The untied layout is presented to the engine as views of the checkpoints: the same files, the head name
pointing at the embedding tensor's bytes where a model has no head of its own.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from merging.common.errors import RamStudioError
from merging.reading.checkpoint import Checkpoint

EMBED_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight")
HEAD_NAMES = ("lm_head.weight", "embed_out.weight")
COMPARE_ROWS_BYTES = 32 << 20  # rows compared at a time


@dataclass(frozen=True)
class HeadCheck:
    """One agent's explicit head against its own embeddings: `tied` when every value is equal."""

    agent: str
    head: str
    embed: str
    max_abs: float  # max |head − embeddings|
    rel_diff: float  # ‖head − embeddings‖ / ‖embeddings‖

    @property
    def tied(self) -> bool:
        return self.max_abs == 0.0

    def difference(self) -> str:
        """What was measured, as a clause: 'equal to its embeddings' or 'differs from … (untied by training: …)'."""
        if self.tied:
            return f"equal to its {self.embed}"
        return (f"differs from its {self.embed} (untied by training: ‖head − embeddings‖ / ‖embeddings‖ = "
                f"{self.rel_diff:.3g}, max |difference| {self.max_abs:.3g})")

    def describe(self) -> str:
        return f"{self.agent} stores an explicit {self.head} {self.difference()}"


def tie_flag(config: dict | None) -> bool | None:
    """`tie_word_embeddings` from a config (the text model's for a vision-language config), or None."""
    cfg = config or {}
    for where in (cfg, cfg.get("text_config")):
        if isinstance(where, dict) and isinstance(where.get("tie_word_embeddings"), bool):
            return where["tie_word_embeddings"]
    return None


def embedding_name(ckpt: Checkpoint) -> str | None:
    """The input embedding tensor (the 2-D tensor named like `…embed_tokens.weight`), when there is one."""
    names = [n for n, e in ckpt.tensors.items() if n.endswith(EMBED_SUFFIXES) and len(e.shape) == 2]
    return names[0] if len(names) == 1 else None


def head_name(ckpt: Checkpoint) -> str | None:
    """The output head tensor stored in the checkpoint, when there is one."""
    return next((n for n in HEAD_NAMES if n in ckpt.tensors), None)


def base_is_tied(base: Checkpoint) -> bool:
    """Whether the base's head is its embeddings: its config says so, or (no config flag) it stores none."""
    flag = tie_flag(base.config)
    embed = embedding_name(base)
    if embed is None or head_name(base) is not None:
        return False
    return True if flag is None else flag


def compare_head(agent: Checkpoint, head: str, embed: str) -> HeadCheck:
    """Read an agent's head and embeddings row block by row block and measure how they differ (float32 values,
    sums in float64); a NaN or Inf in either is an error naming the tensor."""
    h, e = agent.tensors[head], agent.tensors[embed]
    if h.shape != e.shape:
        return HeadCheck(agent.label, head, embed, float("inf"), float("inf"))
    rows = h.shape[0]
    per = max(1, COMPARE_ROWS_BYTES // max(1, 4 * (h.numel // max(1, rows))))
    max_abs, sq_diff, sq_embed = 0.0, 0.0, 0.0
    for start in range(0, rows, per):
        a = agent.read(head, start, min(rows, start + per)).to(torch.float32)
        b = agent.read(embed, start, min(rows, start + per)).to(torch.float32)
        for name, t in ((head, a), (embed, b)):
            if not bool(torch.isfinite(t).all()):
                raise RamStudioError(f"tensor {name!r} of {agent.label} holds NaN or Inf.",
                                     "Repair or re-download that checkpoint.")
        d = (a - b).double()
        max_abs = max(max_abs, float(d.abs().max()) if d.numel() else 0.0)
        sq_diff += float((d * d).sum())
        sq_embed += float((b.double() ** 2).sum())
    agent.release()
    rel = (sq_diff / sq_embed) ** 0.5 if sq_embed > 0 else (0.0 if sq_diff == 0 else float("inf"))
    return HeadCheck(agent.label, head, embed, max_abs, rel)


def check_heads(base: Checkpoint, agents: list[Checkpoint], labels: list[str]) -> list[HeadCheck | None]:
    """For a tied base, each agent's explicit head compared with its embeddings (None where the base is
    untied or the agent stores no head of its own)."""
    if not base_is_tied(base):
        return [None] * len(agents)
    embed = embedding_name(base)
    out: list[HeadCheck | None] = []
    for agent, label in zip(agents, labels):
        head = head_name(agent)
        if head is None or embed not in agent.tensors:
            out.append(None)
            continue
        out.append(dataclasses.replace(compare_head(agent, head, embed), agent=label))
    return out


def _with_tie(config: dict | None, tied: bool) -> dict:
    """A copy of a config with `tie_word_embeddings` set wherever it is given (at the top otherwise)."""
    cfg = dict(config or {})
    cfg["tie_word_embeddings"] = tied
    text = cfg.get("text_config")
    if isinstance(text, dict) and "tie_word_embeddings" in text:
        cfg["text_config"] = {**text, "tie_word_embeddings": tied}
    return cfg


def untied_views(base: Checkpoint, agents: list[Checkpoint]) -> tuple[Checkpoint, list[Checkpoint]]:
    """The base and agents as an untied model: a head named like the agents' (`lm_head.weight` by default)
    that reads the embeddings' bytes wherever a model stores no head, and configs saying untied."""
    embed = embedding_name(base)
    if not base_is_tied(base) or embed is None:
        raise RamStudioError("--untie: the base's output head is not tied to its embeddings "
                             f"(tie_word_embeddings is {tie_flag(base.config)}, and it "
                             f"{'stores' if head_name(base) else 'has no'} head tensor).",
                             "--untie applies to a tied base whose agents stored an explicit head; leave it out.")
    head = next((h for h in (head_name(a) for a in agents) if h is not None), HEAD_NAMES[0])

    def view(ckpt: Checkpoint) -> Checkpoint:
        tensors = dict(ckpt.tensors)
        if head not in tensors:
            if embed not in tensors:
                raise RamStudioError(f"{ckpt.label} has neither {head!r} nor {embed!r}.",
                                     "An agent must hold the base's embeddings; check that it was fine-tuned "
                                     "from this base.")
            tensors[head] = tensors[embed]  # the entry keeps the embeddings' own name: reads go to its bytes
        return dataclasses.replace(ckpt, tensors=tensors, config=_with_tie(ckpt.config, False), _handles={})

    return view(base), [view(a) for a in agents]

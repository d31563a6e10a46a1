"""Base and agents as a merge or an analysis reads them, decided once before any pass: tied heads (and
`--untie`), added tokens (and `--vocab union`), the compatibility report with what these resolve, and the
lineage warnings. `inspect`, `analyze`, `merge` and the app's Models page all start here."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from merging.reading.checkpoint import Checkpoint, unique_labels
from merging.reading.compat import CompatReport, Mismatch, ModelHeaders, check_compatibility
from merging.reading.heads import HeadCheck, check_heads, untied_views
from merging.reading.lineage import LineageWarning, UpdateSample, check_lineage
from merging.reading.vocab import VocabOutcome, VocabPlan, plan_vocabulary

UNTIE_HINT = ("--untie (merge) writes an untied head: the base's embeddings as its θ0 and each agent's head as "
              "its update; --on-mismatch base keeps the base's tie and drops this head update")


@dataclass
class PreparedInputs:
    """The opened models, the views the passes read (the same unless `--untie`), the labels, the compatibility
    report (to enforce), notes for the card and the terminal, and what the checks found."""

    base: Checkpoint
    agents: list[Checkpoint]
    base_view: Checkpoint
    agent_views: list[Checkpoint]
    labels: list[str]
    report: CompatReport
    notes: list[str] = field(default_factory=list)
    heads: list[HeadCheck | None] = field(default_factory=list)
    vocab: VocabOutcome | None = None
    lineage: list[LineageWarning] = field(default_factory=list)
    samples: list[UpdateSample] = field(default_factory=list)

    @property
    def vocab_plan(self) -> VocabPlan | None:
        return self.vocab.plan if self.vocab else None

    def enforce(self, policy: str) -> None:
        """Raise what the mismatch policy does not cover: added tokens first (they explain the vocabulary rows
        that differ, and name the options), then the report's differences."""
        if self.vocab is not None and self.vocab.refusal is not None:
            raise self.vocab.refusal
        self.report.enforce(policy)

    def warnings(self) -> list[str]:
        """One line per lineage warning, each starting with 'warning:' and naming the agent."""
        return [f"warning: {w.text}" for w in self.lineage]


def prepare_inputs(base: Checkpoint, agents: list[Checkpoint], *, policy: str = "error", untie: bool = False,
                   vocab: str = "base", lineage: bool = True) -> PreparedInputs:
    """Check the heads and tokenizers, build the views, compare headers (the report is not enforced here:
    the caller does, after showing it) and measure the lineage sample."""
    labels = unique_labels([a.label for a in agents])
    heads = check_heads(base, agents, labels)
    base_view, views = untied_views(base, agents) if untie else (base, list(agents))
    outcome = plan_vocabulary(base_view, views, labels, vocab, policy)
    report = check_compatibility(ModelHeaders.from_checkpoint(base_view),
                                 [dataclasses.replace(ModelHeaders.from_checkpoint(v), label=label)
                                  for v, label in zip(views, labels)])
    notes = _resolve_heads(report, heads, untie) + outcome.notes
    if untie and not any(h is not None for h in heads):
        notes.append("--untie: no agent stores a head of its own; the untied head equals the merged embeddings.")
    for key in outcome.handled:
        report.handled[key] = "rows of the union vocabulary"
    report.mismatches = [m for m in report.mismatches
                         if not (m.kind == "shape" and (m.agent, m.tensor or "") in outcome.handled)]
    found, samples = check_lineage(base_view, views, labels) if lineage else ([], [])
    return PreparedInputs(base, list(agents), base_view, views, labels, report, notes, heads, outcome, found, samples)


def _resolve_heads(report: CompatReport, heads: list[HeadCheck | None], untie: bool) -> list[str]:
    """Replace the 'extra lm_head' and 'tied_embeddings' differences an explicit head causes by what it is: tied
    (equal to the embeddings: nothing to do) or untied by training (one 'untied_head' difference, which --untie
    or --on-mismatch base resolves)."""
    notes = []
    for check in heads:
        if check is None:
            continue
        report.mismatches = [m for m in report.mismatches if not (
            m.agent == check.agent and (m.kind == "tied_embeddings" or (m.kind == "extra" and m.tensor == check.head)))]
        if untie:
            notes.append(f"--untie: {check.describe()}: " + ("its head update is its embedding update." if check.tied
                                                             else "its head update is merged as its own."))
        elif check.tied:
            report.handled[(check.agent, check.head)] = "equal to its embeddings"
            notes.append(f"{check.describe()}: treated as tied, like the base.")
        else:
            report.handled[(check.agent, check.head)] = "the base's tie is kept"
            report.mismatches.append(Mismatch(check.agent, "untied_head", check.head,
                                              f"{check.difference()}; {UNTIE_HINT}"))
            notes.append(f"{check.describe()}: the base's tie is kept, so its head update is dropped (its "
                         "embedding update is merged); --untie would keep it.")
    if untie:
        notes.insert(0, "--untie: the output's head is untied (tie_word_embeddings false): merged from the base's "
                        "embeddings as θ0 and each agent's head (its embeddings where it is tied).")
    report.mismatches.sort(key=lambda m: (m.agent, m.kind, m.tensor or ""))
    return notes

"""lm-evaluation-harness documents as a Fisher pass's examples: one task's training split (else its validation
split, when the task has a separate test split to report; never the reported split), each document as the
zero-shot context lm-eval would give the model and the task's reference continuation.

generate_until tasks: the reference is `doc_to_target`; the agent's own answers stop at the task's `until`
strings and `max_gen_toks`. multiple_choice and loglikelihood tasks: the reference is the gold choice (after
the task's target delimiter); their Fisher takes reference answers only.
"""
from __future__ import annotations

from typing import Any

from merging.common.errors import RamStudioError

from .fisher_pass import FisherData, FisherExample

GENERATE = "generate_until"


def lm_eval_fisher_examples(evaluator: Any, task: str, n: int) -> FisherData:
    """The first `n` documents of `task` as FisherData (one clear line when the task cannot give them)."""
    from .quiet import quiet_libraries

    tasks = evaluator._load([task])["tasks"]
    if list(tasks) != [task]:
        raise RamStudioError(f"lm-eval task {task!r} is a group of {len(tasks)} tasks; a Fisher needs one task per "
                             "agent.", f"Name one of its tasks, e.g. {', '.join(list(tasks)[:3])}.")
    t = tasks[task]
    with quiet_libraries():
        docs, split, notes = _docs(t, task)
    if len(docs) < n:
        raise RamStudioError(f"lm-eval task {task!r} has {len(docs)} examples in its {split} split; the Fisher asks "
                             f"for {n}.", f"Ask for at most {len(docs)} Fisher examples.")
    kind = t.config.output_type
    gen = dict(t.config.generation_kwargs or {})
    until = gen.get("until", ["\n\n"])
    stop = tuple([until] if isinstance(until, str) else until or ())
    budget = int(gen.get("max_gen_toks", 256))
    examples = []
    with quiet_libraries():
        for doc in docs.select(range(n)) if hasattr(docs, "select") else list(docs)[:n]:
            context = t.fewshot_context(doc, 0)
            if not isinstance(context, str):
                raise RamStudioError(f"lm-eval task {task!r} builds chat messages, not a text context.",
                                     "Fisher data needs a text task.")
            examples.append(FisherExample(context, _reference(t, doc, kind), budget, stop if kind == GENERATE else ()))
    source = f"lm-eval|{evaluator.version}|{evaluator.include_digest()}|{kind}"
    if kind == GENERATE:
        return FisherData(task, split, tuple(examples), source, tuple(notes))
    return FisherData(task, split, tuple(examples), source, tuple(notes) + (
        f"{task} is a {kind} task: only reference answers apply",), rules=("reference",))


def _docs(t: Any, task: str) -> tuple[Any, str, list[str]]:
    """(documents, split name, notes): the training split, else a validation split apart from the test split."""
    if t.has_training_docs():
        return t.training_docs(), str(t.config.training_split), []
    if t.has_validation_docs() and t.has_test_docs():
        return t.validation_docs(), str(t.config.validation_split), [
            f"lm-eval task {task} has no training split: its Fisher uses the validation split, which a sweep also "
            "selects on (never the reported test split)."]
    raise RamStudioError(f"lm-eval task {task!r} has no training split (nor a validation split apart from the split "
                         "it is scored on) to compute a Fisher on.",
                         "Give a task with a training split (or add one to its YAML: training_split).")


def _reference(t: Any, doc: dict, kind: str) -> str:
    """The reference continuation of one document: the target (generate_until) or the gold choice."""
    target = t.doc_to_target(doc)
    if kind == GENERATE:
        if isinstance(target, list):
            target = target[0] if target else ""
        return str(target)
    choices = t.doc_to_choice(doc)
    gold = target if isinstance(target, int) else choices.index(target) if target in choices else None
    if isinstance(gold, list):
        gold = gold[0]
    if gold is None or not 0 <= gold < len(choices):
        raise RamStudioError("an lm-eval document's gold answer is not one of its choices.", "Check the task's data.")
    return t.config.target_delimiter + choices[gold]

"""lm-evaluation-harness glue for the RAM Studio demo tasks: the data loader (`load`) and the metric
(`process_results`: the demo's own verifier).

The data is read from `data/` next to this file, whatever the current directory. The decoding budget:
every demo model's `generation_config.json` sets `max_new_tokens: 96`, which transformers lets win over the
`max_length` lm-eval derives from `max_gen_toks`, so the code (8 tokens) and memory (4 tokens) tasks decode
up to 96 tokens under lm-eval. `process_results` therefore keeps only the first `max_new_tokens` tokens of
the output (re-tokenized with the demo tokenizer) before verifying: with greedy decoding those are the
tokens the demo evaluator decodes with its budget.

Why this module is here, the one Python file under `assets/` (which holds data; the demo's code is the `demo`
package): the task YAML files name it as `!function utils.load` / `!function utils.process_results`, and
lm-eval resolves such a name to a file beside the YAML file that names it, so it must sit next to them. It
stays glue: the tasks, their verifiers and budgets are imported from `demo.tasks`; `demo/lm_eval_tasks/
make_data.py` writes the YAML files and the data.
"""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENIZER = HERE.parent / "models" / "base" / "tokenizer.json"

try:
    from demo.tasks import Example, verify
except ImportError:  # a checkout that is not installed: the repository root is three levels up
    sys.path.insert(0, str(HERE.parents[2]))
    from demo.tasks import Example, verify


def _rows(task: str, split: str) -> list[dict]:
    with open(HERE / "data" / f"{task}_{split}.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


TRAIN_ROWS = 2048  # the paper's largest Fisher N (its Table 11): the train split a Fisher pass reads


@functools.lru_cache(maxsize=4)
def _train_rows(task: str) -> tuple[dict, ...]:
    """The first TRAIN_ROWS examples of the demo's train split (made from the task generators, not stored: the
    same examples the demo evaluator's Fisher reads), in the rows' format."""
    from demo.tasks import MAX_NEW_TOKENS, make_split

    return tuple({"task": e.task, "subset": e.subset, "prompt": e.prompt, "answer": e.answer, "habit": e.habit,
                  "max_new_tokens": MAX_NEW_TOKENS[task]} for e in make_split(task, "train", TRAIN_ROWS))


def load(task: str, **_: object) -> dict:
    """`custom_dataset`: the task's train (for a Fisher pass; never scored), validation and test rows as in-memory
    datasets (no cache files)."""
    import datasets

    splits = {split: datasets.Dataset.from_list(_rows(task, split)) for split in ("validation", "test")}
    splits["train"] = datasets.Dataset.from_list(list(_train_rows(task)))
    return splits


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER))


def within_budget(text: str, max_new_tokens: int) -> str:
    """The output cut to its first `max_new_tokens` tokens (unchanged when it is not longer)."""
    ids = _tokenizer().encode(text, add_special_tokens=False).ids
    return text if len(ids) <= max_new_tokens else _tokenizer().decode(ids[:max_new_tokens])


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """acc = the demo verifier's verdict on the output cut to the task's budget."""
    example = Example(doc["task"], doc["subset"], doc["prompt"], doc["answer"], doc["habit"])
    return {"acc": float(verify(example, within_budget(results[0], int(doc["max_new_tokens"]))))}

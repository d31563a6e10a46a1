"""Where a sweep keeps every score as soon as it has it, so that an interrupted sweep resumes from them.

One small JSON file per scoring, named by a hash of everything the score depends on: the inputs' content
fingerprints (and mismatch policy), the method and every parameter value, the evaluator's fingerprint, its
tasks, the split and the example limit, and the versions of RAM Studio and torch. Same key, same score;
anything different is a different file. Entries are written atomically and never trusted blindly: one that
cannot be read or whose recorded key differs is ignored, and one with the right key but damaged content (not
JSON, too deep or too large, a score that is not a number, scores that are not a mapping…) is ignored, counted
in `damaged` (a sweep reports them once, in one note) and scored again.

The folder ($RAM_STUDIO_SWEEP_CACHE) follows the placement rules of every output: it is never, contains or lies
inside an input (`check`, with the sweep's inputs), it is checked again before every write, and entries are read
and written by name through the folder handle opened then (merging/writing/checked_output.py).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from merging.common.untrusted import loads_json
from merging.writing.checked_output import CheckedFolder
from merging.writing.placement import Protected

STORE_VERSION = 1
MAX_ENTRY_BYTES = 4 << 20  # an entry holds a few scores and metrics: kilobytes
HINT = ("Point RAM_STUDIO_SWEEP_CACHE at a folder outside every model folder and task folder (or unset it), "
        "or sweep without resuming (--no-resume still stores scores, in the same folder).")


def store_dir() -> Path:
    """$RAM_STUDIO_SWEEP_CACHE, else ~/.cache/ram-studio/sweeps."""
    root = os.environ.get("RAM_STUDIO_SWEEP_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "ram-studio" / "sweeps"


def score_key(context: dict[str, Any], what: dict[str, Any], split: str) -> dict[str, Any]:
    """Everything a score depends on, as one JSON-able mapping (`context`: inputs, evaluator, versions)."""
    return {"version": STORE_VERSION, **context, **what, "split": split}


def _name(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:40]


def _number(v: Any, finite: bool = True) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and (not finite or math.isfinite(v))


def result_problem(result: Any) -> str | None:
    """What is wrong with a stored result (None when it has the shape a scoring returns)."""
    if not isinstance(result, dict):
        return "the result is not a mapping"
    if result.get("error") is not None:
        return None if isinstance(result["error"], str) else "its error is not text"
    for field, finite in (("scores", True), ("detail", False), ("n", True)):
        value = result.get(field, {})
        if not isinstance(value, dict):
            return f"its {field} are not a mapping"
        if not all(isinstance(k, str) and _number(v, finite) for k, v in value.items()):
            return f"its {field} hold something that is not a number"
    if result.get("average") is not None and not _number(result["average"]):
        return "its average is not a number"
    if not all(_number(result.get(f, 0.0)) for f in ("merge_s", "eval_s")):
        return "its timings are not numbers"
    lambdas = result.get("lambdas")
    if lambdas is not None and not (isinstance(lambdas, list) and all(_number(x) for x in lambdas)):
        return "its λ values are not numbers"
    return None


class ScoreStore:
    """Scores by key on disk (`folder`, default store_dir()); `read` False reads nothing but still writes."""

    def __init__(self, folder: Path | None = None, *, read: bool = True) -> None:
        self.folder = Path(folder) if folder is not None else store_dir()
        self.read = read
        self.damaged: list[str] = []  # names of damaged entries met (each ignored and scored again)
        self._dir: CheckedFolder | None = None

    def check(self, inputs: list[Protected]) -> None:
        """Open the folder under the placement rules, against the sweep's inputs (before anything is scored)."""
        self._dir = CheckedFolder(self.folder, inputs, "score store folder", HINT)

    def _folder(self) -> CheckedFolder:
        if self._dir is None:
            self.check([])
        assert self._dir is not None
        return self._dir

    def get(self, key: dict[str, Any]) -> dict[str, Any] | None:
        """The stored result for `key`, or None (absent, another key's, or damaged: noted in `damaged`)."""
        if not self.read:
            return None
        name = f"{_name(key)}.json"
        try:
            data = self._folder().read(name, MAX_ENTRY_BYTES)
            if data is None:
                return None
            doc = loads_json(data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):  # not JSON, too deep, too large, not a regular file
            return self._damaged(name)
        if not isinstance(doc, dict) or "key" not in doc:
            return self._damaged(name)
        canonical = json.loads(json.dumps(key, sort_keys=True, default=str))
        if doc["key"] != canonical:
            return None  # another key's entry under this name: not ours to judge
        if result_problem(doc.get("result")) is not None:
            return self._damaged(name)
        return doc["result"]

    def _damaged(self, name: str) -> None:
        if name not in self.damaged:
            self.damaged.append(name)
        return None

    def note(self) -> str | None:
        """One line about the damaged entries met (None when there were none)."""
        if not self.damaged:
            return None
        n = len(self.damaged)
        return (f"{n} damaged score store entr{'y' if n == 1 else 'ies'} in {self.folder} (e.g. {self.damaged[0]}) "
                "ignored and scored again")

    def put(self, key: dict[str, Any], result: dict[str, Any]) -> None:
        """Store `result` under `key` (temporary file, then rename: a reader never sees half an entry)."""
        doc = {"key": json.loads(json.dumps(key, sort_keys=True, default=str)), "result": result}
        self._folder().write(f"{_name(key)}.json", json.dumps(doc).encode())

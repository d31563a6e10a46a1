"""Where a sweep keeps every score as soon as it has it, so that an interrupted sweep resumes from them.

One small JSON file per scoring, named by a hash of everything the score depends on: the inputs' content
fingerprints (and mismatch policy), the method and every parameter value, the evaluator's fingerprint, its
tasks, the split and the example limit, and the versions of RAM Studio and torch. Same key, same score;
anything different is a different file. Entries are written atomically and never trusted blindly: one that
cannot be read or whose recorded key differs is ignored (and scored again).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

STORE_VERSION = 1


def store_dir() -> Path:
    """$RAM_STUDIO_SWEEP_CACHE, else ~/.cache/ram-studio/sweeps."""
    root = os.environ.get("RAM_STUDIO_SWEEP_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "ram-studio" / "sweeps"


def score_key(context: dict[str, Any], what: dict[str, Any], split: str) -> dict[str, Any]:
    """Everything a score depends on, as one JSON-able mapping (`context`: inputs, evaluator, versions)."""
    return {"version": STORE_VERSION, **context, **what, "split": split}


def _name(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:40]


class ScoreStore:
    """Scores by key on disk (`folder`, default store_dir()); `enabled` False reads nothing but still writes."""

    def __init__(self, folder: Path | None = None, *, read: bool = True) -> None:
        self.folder = Path(folder) if folder is not None else store_dir()
        self.read = read

    def get(self, key: dict[str, Any]) -> dict[str, Any] | None:
        """The stored result for `key`, or None."""
        if not self.read:
            return None
        path = self.folder / f"{_name(key)}.json"
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        canonical = json.loads(json.dumps(key, sort_keys=True, default=str))
        if not isinstance(doc, dict) or doc.get("key") != canonical or not isinstance(doc.get("result"), dict):
            return None
        return doc["result"]

    def put(self, key: dict[str, Any], result: dict[str, Any]) -> None:
        """Store `result` under `key` (temporary file, then rename: a reader never sees half an entry)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        name = _name(key)
        doc = {"key": json.loads(json.dumps(key, sort_keys=True, default=str)), "result": result}
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.folder / f"{name}.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

"""On-disk cache of analysis results, keyed by a fingerprint of the inputs.

Entries are JSON (never pickle), written to a temporary file and renamed, so two app sessions may
write the same entry at once; an unreadable or inconsistent entry is ignored and rebuilt.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from merging.checkpoint import Checkpoint

CACHE_VERSION = 2  # 2: shared-region diagnostics (pair frame, dominance)


def cache_dir() -> Path:
    """$RAM_STUDIO_CACHE, else ~/.cache/ram-studio/analysis."""
    root = os.environ.get("RAM_STUDIO_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "ram-studio" / "analysis"


def fingerprint(base: Checkpoint, agents: list[Checkpoint], ladder: tuple[float, ...], policy: str) -> str:
    """Hash of every input file's path, size, modification time and header bytes, plus the ladder."""
    h = hashlib.sha256(f"v{CACHE_VERSION}|{policy}|{list(ladder)}".encode())
    for role, c in [("base", base)] + [("agent", a) for a in agents]:
        h.update(f"|{role}:{c.folder.resolve()}".encode())
        for fh in c.headers:
            st = fh.path.stat()
            h.update(f"|{fh.path.name}:{fh.file_size}:{st.st_mtime_ns}:{fh.header_sha256}".encode())
    return h.hexdigest()[:32]


def load(key: str) -> dict | None:
    """The cached payload for `key`, or None when absent or damaged (damaged entries are removed)."""
    path = cache_dir() / f"{key}.json"
    try:
        payload = json.loads(path.read_text())
        if payload.get("version") != CACHE_VERSION or payload.get("key") != key:
            raise ValueError("stale entry")
        return payload
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        path.unlink(missing_ok=True)
        return None


def save(key: str, payload: dict) -> None:
    """Atomically store `payload` under `key` (write a temp file in the same folder, then rename)."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    payload = {**payload, "version": CACHE_VERSION, "key": key}
    fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f)
        os.replace(tmp, folder / f"{key}.json")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

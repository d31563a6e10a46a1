"""On-disk cache of analysis results, keyed by a fingerprint of the inputs.

Entries are a JSON header and raw numeric columns (analysis/cache_format.py; never pickle), written to a temporary file
and renamed, so two app sessions may write the same entry at once; an unreadable or inconsistent entry is ignored and
rebuilt (replaced by the new entry, never deleted on its own). The cache folder may not be, contain or lie inside an
input (compared by identity, like every output), checked when an analysis starts and again before its entry is written;
entries are read (bounded, regular files only) and written by name through the folder handle opened at the check
(merging/writing/checked_output.py). A temporary file left by a killed writer is removed by the next writer when it is
provably ours: named by our pattern, written on this host by a process that is gone.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
import uuid
from pathlib import Path

from merging.common.errors import RamStudioError
from merging.reading.checkpoint import Checkpoint
from merging.writing.checked_output import CheckedFolder

_TMP = re.compile(r"\.(?P<key>[0-9a-f]{32})\.(?P<host>[A-Za-z0-9._-]{1,64})\.(?P<pid>\d{1,10})\.[0-9a-f]{8}\.tmp")
CACHE_VERSION = 5  # 2: shared-region diagnostics; 3: tower, expert and role columns; 4: precision statistics;
# 5: columnar entries, per-tensor chance columns, rows per group of tensors for models of very many tensors
MAX_ENTRY_BYTES = 1 << 30  # a row per unit × ε × agent (or pair): ~100 MB for 20,000 tensors
SUFFIX = ".stats"
HINT = ("Point RAM_STUDIO_CACHE at a folder outside every model folder (or unset it), or analyse without the cache "
        "(--no-cache).")


def cache_dir() -> Path:
    """$RAM_STUDIO_CACHE, else ~/.cache/ram-studio/analysis."""
    root = os.environ.get("RAM_STUDIO_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "ram-studio" / "analysis"


def check_location(checkpoints: list[Checkpoint]) -> CheckedFolder:
    """The cache folder, opened under the placement rules: never, containing or inside one of the inputs (a cache
    written into a model folder would change it)."""
    from merging.writing.placement import protected_paths

    return CheckedFolder(cache_dir(), protected_paths([(c.ref.raw, c.folder) for c in checkpoints]),
                         "analysis cache folder", HINT)


def fingerprint(base: Checkpoint, agents: list[Checkpoint], ladder: tuple[float, ...], policy: str,
                unit: str = "abs") -> str:
    """Hash of every input file's path, size, modification time and header bytes, plus the ladder (and its
    unit when in steps)."""
    tag = "" if unit == "abs" else f"|{unit}"
    h = hashlib.sha256(f"v{CACHE_VERSION}|{policy}|{list(ladder)}{tag}".encode())
    for role, c in [("base", base)] + [("agent", a) for a in agents]:
        h.update(f"|{role}:{c.folder.resolve()}".encode())
        for fh in c.headers:
            st = fh.path.stat()
            h.update(f"|{fh.path.name}:{fh.file_size}:{st.st_mtime_ns}:{fh.header_sha256}".encode())
    return h.hexdigest()[:32]


def load(key: str, folder: CheckedFolder | None = None) -> dict | None:
    """The cached payload for `key` ({"meta", "tables", "arrays"}), or None when absent or damaged (a damaged
    entry is replaced by the next `save`). Without `folder`, the cache folder is opened with no inputs to compare
    (reading only)."""
    from .cache_format import decode

    try:
        folder = folder or CheckedFolder(cache_dir(), [], "analysis cache folder", HINT, create=False)
        data = folder.read(f"{key}{SUFFIX}", MAX_ENTRY_BYTES)
        if data is None:
            return None
        meta, tables, arrays = decode(data)
        if meta.get("version") != CACHE_VERSION or meta.get("key") != key or set(tables) != {"frame", "pairs"}:
            raise ValueError("stale entry")
        return {"meta": meta, "tables": tables, "arrays": arrays}
    except (OSError, ValueError, AttributeError, UnicodeDecodeError, RamStudioError, TypeError, KeyError):
        return None


def save(key: str, payload: dict, folder: CheckedFolder) -> None:
    """Atomically store `payload` under `key` in the checked cache folder (placement checked again first)."""
    from .cache_format import encode

    remove_orphans(folder)
    data = encode({**payload["meta"], "version": CACHE_VERSION, "key": key}, payload["tables"], payload["arrays"])
    folder.write(f"{key}{SUFFIX}", data, tmp=f".{key}.{host_name()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def remove_orphans(folder: CheckedFolder) -> list[str]:
    """Remove temporary files that killed writers left in the cache folder: only regular files named by our
    pattern, written on this host by a process that no longer exists. Returns what
    was removed."""
    removed = []
    host = host_name()
    for name in folder.names():
        m = _TMP.fullmatch(name)
        if m is None or m["host"] != host or int(m["pid"]) == os.getpid() or _alive(int(m["pid"])):
            continue
        try:
            folder.unlink(name)
            removed.append(name)
        except OSError:
            pass
    return removed


def host_name() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True

"""What a long-running server keeps in memory, bounded: a least-recently-used store that counts the bytes of
what it holds (the frames and arrays inside each value, measured) and drops the oldest values past its limit.

Two stores use it: the analyses every session shares (app/state.py) and the finished job records (app/jobs.py).
Their limits are settings of the server process, read once when the store is created:
`RAM_STUDIO_APP_ANALYSIS_MEMORY` and `RAM_STUDIO_APP_JOB_MEMORY` (a size: 500MB, 2GB, 2GiB or bytes).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections import OrderedDict
from pathlib import PurePath
from typing import Any, Callable

from merging.common.errors import RamStudioError, printable
from merging.common.units import format_bytes, parse_size

ANALYSIS_ENV = "RAM_STUDIO_APP_ANALYSIS_MEMORY"
JOB_ENV = "RAM_STUDIO_APP_JOB_MEMORY"
DEFAULT_ANALYSIS_BYTES = 1_000_000_000  # about 370 analyses of a Qwen2.5-7B trio (2.7 MB of statistics each)
DEFAULT_JOB_BYTES = 256_000_000
FORGOTTEN = 1024  # how many dropped keys a store remembers (to say "dropped", not "never computed")
_MAX_NODES = 200_000  # measuring walks at most this many objects (a bounded estimate, never a hang)


def limit_from_env(name: str, default: int, log: Callable[[str], None] | None = None) -> int:
    """The byte limit an environment variable sets (a size such as 2GB), or `default` when it is unset; an
    unreadable value keeps the default and says so in the server's log (one line)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return parse_size(text)
    except RamStudioError as exc:
        (log or _stderr)(f"{name}={printable(text, 40)!r} is not a size ({exc.message} {exc.hint}); using the "
                         f"default {format_bytes(default)}.")
        return default


def return_freed_memory() -> None:
    """Free what dropped values leave behind and give it back to the operating system: the charts and tables
    made from an analysis hold reference cycles that Python's collector reaches only after many more allocations,
    and glibc keeps freed blocks in its arenas (one per thread that allocated; Streamlit runs every page in a new
    thread). Without this a server's resident size stayed near its peak after it dropped values.

    A full collection takes most of a second in a large process, so they are spaced: the first drop collects at
    once; drops within COLLECT_GAP_S of a collection are covered by one more collection at the end of that gap
    (on a timer thread), never one per drop."""
    global _NEXT_AT
    now = time.monotonic()
    with _COLLECT_LOCK:
        if _NEXT_AT is not None:  # a collection is already due at the end of the gap
            return
        last = _LAST_AT
        if now - last < COLLECT_GAP_S:
            _NEXT_AT = last + COLLECT_GAP_S
            timer = threading.Timer(_NEXT_AT - now, _collect)
            timer.daemon = True
            timer.start()
            return
    _collect()


def _collect() -> None:
    global _LAST_AT, _NEXT_AT
    import gc

    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    with _COLLECT_LOCK:
        _LAST_AT, _NEXT_AT = time.monotonic(), None


COLLECT_GAP_S = 2.0
_COLLECT_LOCK = threading.Lock()
_LAST_AT = -COLLECT_GAP_S  # monotonic time of the last collection
_NEXT_AT: float | None = None  # when the one pending collection runs, if any


def _malloc_trim():
    """glibc's malloc_trim, or None (another C library)."""
    global _TRIM
    if _TRIM is False:
        import ctypes
        import ctypes.util

        try:
            _TRIM = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_trim", None)
        except OSError:
            _TRIM = None
    return _TRIM


_TRIM: Any = False  # not looked up yet


def _stderr(line: str) -> None:
    print(f"RAM Studio: {line}", file=sys.stderr, flush=True)


def measure_bytes(obj: Any) -> int:
    """Bytes held by `obj`: pandas frames and series (deep), numpy arrays and torch tensors by their buffers,
    containers and dataclasses by what they hold (each object once), anything else by sys.getsizeof."""
    seen: set[int] = set()
    stack, total = [obj], 0
    while stack and len(seen) < _MAX_NODES:
        o = stack.pop()
        if o is None or id(o) in seen or isinstance(o, (threading.Event, threading.Thread, type)):
            continue
        seen.add(id(o))
        total += _own_bytes(o, stack)
    return total


def _own_bytes(o: Any, stack: list) -> int:
    """The bytes `o` itself holds; what it refers to goes onto `stack`."""
    kind = type(o).__module__.split(".")[0]
    if kind == "pandas" and hasattr(o, "memory_usage"):
        usage = o.memory_usage(deep=True)
        return int(usage.sum()) if hasattr(usage, "sum") else int(usage)
    if kind == "numpy" and hasattr(o, "nbytes"):
        if getattr(o, "base", None) is not None:  # a view: the memory is its base's
            stack.append(o.base)
            return sys.getsizeof(o)
        return int(o.nbytes)
    if kind == "torch" and hasattr(o, "untyped_storage"):
        return int(o.untyped_storage().nbytes())
    if isinstance(o, (str, bytes, bytearray, int, float, bool, complex, PurePath)):
        return sys.getsizeof(o)
    if isinstance(o, dict):
        stack.extend(o.keys())
        stack.extend(o.values())
    elif isinstance(o, (list, tuple, set, frozenset)):
        stack.extend(o)
    elif dataclasses.is_dataclass(o):
        stack.extend(getattr(o, f.name, None) for f in dataclasses.fields(o))
    elif hasattr(o, "__dict__"):
        stack.extend(vars(o).values())
    return sys.getsizeof(o)


class LRUStore:
    """A thread-safe mapping that keeps its values within `limit` bytes (each measured when stored), dropping
    the least recently used first. The value stored last always stays, even alone over the limit (its page is
    using it); it goes when the next one comes. Dropped keys are remembered (the last FORGOTTEN) so a page can
    say that a value was dropped rather than never made."""

    def __init__(self, limit: int, name: str, *, log: Callable[[str], None] | None = None,
                 on_drop: Callable[[str, Any, int], None] | None = None, plural: str | None = None) -> None:
        self.limit, self.name, self.plural = limit, name, plural or f"{name}s"
        self._log = log or _stderr
        self._on_drop = on_drop  # told (key, value, size) of each value dropped, outside the store's lock
        self._lock = threading.Lock()
        self._values: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._dropped: OrderedDict[str, int] = OrderedDict()  # key -> its size when it was dropped
        self.bytes = 0
        self.evictions = 0

    def get(self, key: str) -> Any | None:
        """The value (now the most recently used), or None."""
        with self._lock:
            hit = self._values.get(key)
            if hit is None:
                return None
            self._values.move_to_end(key)
            return hit[0]

    def put(self, key: str, value: Any, size: int | None = None) -> int:
        """Store `value` (measured unless `size` is given) and drop the oldest values past the limit; its size."""
        size = measure_bytes(value) if size is None else size
        with self._lock:
            old = self._values.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._values[key] = (value, size)
            self._dropped.pop(key, None)
            self.bytes += size
            gone = self._evict()
        for k, v, n in gone:
            self._log(f"dropped {self.name} {printable(k, 160)!r} ({format_bytes(n)}) from memory to stay within "
                      f"its limit: {self.summary()}.")
            if self._on_drop is not None:
                self._on_drop(k, v, n)
        if gone:
            del gone, v
            return_freed_memory()
        return size

    def _evict(self) -> list[tuple[str, Any, int]]:
        gone = []
        while self.bytes > self.limit and len(self._values) > 1:
            key, (value, size) = self._values.popitem(last=False)
            self.bytes -= size
            self.evictions += 1
            self._dropped[key] = size
            gone.append((key, value, size))
        while len(self._dropped) > FORGOTTEN:
            self._dropped.popitem(last=False)
        return gone

    def pop(self, key: str) -> Any | None:
        """Remove a value on purpose (not remembered as dropped)."""
        with self._lock:
            hit = self._values.pop(key, None)
            if hit is None:
                return None
            self.bytes -= hit[1]
            return hit[0]

    def was_dropped(self, key: str) -> bool:
        """True when `key` was dropped to stay within the limit (and not stored again since)."""
        with self._lock:
            return key in self._dropped

    def values(self) -> list[Any]:
        """A snapshot of the values, least recently used first (does not count as a use)."""
        with self._lock:
            return [v for v, _ in self._values.values()]

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._values

    def summary(self) -> str:
        """One line for the server log or a page: how much is kept, of what limit."""
        n = len(self)
        what = self.name if n == 1 else self.plural
        return f"{n} {what} kept, {format_bytes(self.bytes)} of {format_bytes(self.limit)}"

"""Where a command's time goes: with $RAM_STUDIO_TIMELINE set, `mark(label)` notes the wall time since the
process started, the CPU time this process has used and its resident memory, and the marks are printed to stderr
when the process exits (tests/benchmarks/analyze_vs_floor.py reads them). Without it, `mark` does nothing."""
from __future__ import annotations

import atexit
import os
import sys
import time

ENABLED = bool(os.environ.get("RAM_STUDIO_TIMELINE"))
_MARKS: list[tuple[str, float, float, str]] = []


def _started() -> float:
    """The process's start on the perf_counter clock (from /proc; now when unknown)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return time.perf_counter() - (up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter()


_START = _started() if ENABLED else 0.0


def mark(label: str) -> None:
    """Note that `label` is reached (only with $RAM_STUDIO_TIMELINE)."""
    if ENABLED:
        _MARKS.append((label, time.perf_counter() - _START, time.process_time(), _memory()))


def _memory() -> str:
    """Resident memory now and at its peak so far (VmRSS, VmHWM), in MB."""
    try:
        with open("/proc/self/status") as f:
            kb = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if k in ("VmRSS", "VmHWM")}
        return f"{kb['VmRSS'] / 1024:7.0f} MB rss {kb['VmHWM'] / 1024:7.0f} MB peak"
    except (OSError, ValueError, KeyError):
        return ""


def _dump() -> None:
    for label, wall, cpu, memory in _MARKS:
        print(f"ram-studio timeline: {wall:8.3f} s wall {cpu:8.3f} s cpu {memory}  {label}", file=sys.stderr,
              flush=True)


if ENABLED:
    atexit.register(_dump)

"""Run a command and sample its process tree's memory from /proc every few tens of milliseconds."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Optional


@dataclass
class Measurement:
    """Wall time and peak memory (summed over the process tree) of one command."""

    argv: list[str]
    rc: int
    wall_s: float
    peak_vmrss_mb: float
    peak_rssanon_mb: float
    samples: int
    log_path: Optional[str]

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return asdict(self)


def _children_map() -> dict[int, list[int]]:
    """ppid -> child pids, from /proc/*/stat (this kernel has no /proc/PID/task/*/children)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _tree(root: int) -> list[int]:
    """root and all its descendants."""
    kids, out, todo = _children_map(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def _rss_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) of pid in kB; zeros if it is gone."""
    rss = anon = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
    except OSError:
        pass
    return rss, anon


def run_measured(argv: list[str], log_path: Optional[str] = None, interval: float = 0.03,
                 env: Optional[dict[str, str]] = None, cwd: Optional[str] = None,
                 timeout: Optional[float] = None) -> Measurement:
    """Run argv to completion, sampling peak VmRSS/RssAnon of it and its children."""
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    peak_rss = peak_anon = samples = 0
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        while proc.poll() is None:
            rss = anon = 0
            for pid in _tree(proc.pid):
                r, a = _rss_kb(pid)
                rss += r
                anon += a
            peak_rss, peak_anon = max(peak_rss, rss), max(peak_anon, anon)
            samples += 1
            if timeout is not None and time.perf_counter() - t0 > timeout:
                proc.kill()
                proc.wait()
                break
            time.sleep(interval)
        rc = proc.wait()
        wall = time.perf_counter() - t0
    finally:
        if log_path:
            log.close()
    return Measurement(list(argv), rc, wall, peak_rss / 1024, peak_anon / 1024, samples, log_path)

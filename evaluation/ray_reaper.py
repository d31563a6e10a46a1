"""Ends what is left of a local Ray instance once the sweep that started it is gone (standard library only: run as a
script, `python -I ray_reaper.py PID STARTTIME MARKER FOLDER`).

A sweep's CLI starts this small process beside its local Ray instance. It waits until the CLI process has exited
(however: a normal end, SIGTERM, SIGINT, or SIGKILL by the OOM killer) or until it is told to finish (SIGTERM),
then ends every process of this user whose environment carries the instance's marker (Ray's GCS, raylet, agents
and workers inherit it; nothing else has it: it is a fresh random value) and removes the instance's folder (a
folder the sweep made for it with mkdtemp). Ray's own shutdown does the same on a normal end; this covers the ends
where no code of the CLI runs any more.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time


def _starttime(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat): tells a reused PID apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


def marked(marker: str) -> list[int]:
    """The PIDs of this user's processes whose initial environment holds MARKER (this process excluded)."""
    needle = f"RAM_STUDIO_RAY_SESSION={marker}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != os.getuid():
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(name))
        except OSError:
            continue
    return out


def end_marked(marker: str, grace: float = 3.0) -> list[int]:
    """SIGTERM every marked process, SIGKILL those still there after `grace` seconds; returns what was found."""
    found = marked(marker)
    for pid in found:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and marked(marker):
        time.sleep(0.1)
    for pid in marked(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return found


def main(argv: list[str]) -> int:
    pid, start, marker, folder = int(argv[0]), argv[1], argv[2], argv[3]
    told = []
    signal.signal(signal.SIGTERM, lambda *_: told.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the terminal is the CLI's to handle
    while not told and _starttime(pid) == start:
        time.sleep(0.25)
    end_marked(marker)
    if os.path.basename(folder).startswith("ram-studio-ray-"):
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

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


def _uses_folder(pid: str, folder: str) -> bool:
    """Whether the process holds a file, or its working directory, inside the instance's folder (its logs)."""
    inside = folder.rstrip("/") + "/"
    try:
        if os.readlink(f"/proc/{pid}/cwd").startswith(inside):
            return True
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(inside):
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False


def marked(marker: str, folder: str | None = None, spare: int | None = None) -> list[int]:
    """The PIDs of this user's processes whose initial environment holds MARKER, or (with `folder`) that hold a
    file inside the instance's folder: a process that renamed itself may have overwritten the memory its
    environment is read from (this process and `spare`, the process that started the instance, excluded: it
    holds files there too while it runs)."""
    needle = f"RAM_STUDIO_RAY_SESSION={marker}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (os.getpid(), spare):
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != os.getuid():
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(name))
                    continue
        except OSError:
            continue
        if folder is not None and _uses_folder(name, folder):
            out.append(int(name))
    return out


def end_marked(marker: str, folder: str | None = None, grace: float = 3.0, patience: float = 20.0,
               spare: int | None = None) -> list[int]:
    """SIGTERM every marked process, SIGKILL those still there after `grace` seconds, and keep at it (a process
    the instance started meanwhile) until none is left or `patience` seconds have passed; returns what was found."""
    found = marked(marker, folder, spare)
    for pid in found:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and marked(marker, folder, spare):
        time.sleep(0.1)
    deadline = time.monotonic() + patience
    while True:
        left = [pid for pid in marked(marker, folder, spare) if not _zombie(pid)]
        if not left or time.monotonic() > deadline:
            return sorted(set(found) | set(left))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)


def _zombie(pid: int) -> bool:
    """Whether the process has ended and only waits for its parent to collect it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        return stat[stat.rindex(")") + 2:].split()[0] in ("Z", "X")
    except (OSError, ValueError):
        return True


def main(argv: list[str]) -> int:
    pid, start, marker, folder = int(argv[0]), argv[1], argv[2], argv[3]
    told = []
    signal.signal(signal.SIGTERM, lambda *_: told.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the terminal is the CLI's to handle
    while not told and _starttime(pid) == start:
        time.sleep(0.25)
    end_marked(marker, folder if os.path.basename(folder).startswith("ram-studio-ray-") else None, spare=pid)
    if os.path.basename(folder).startswith("ram-studio-ray-"):
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

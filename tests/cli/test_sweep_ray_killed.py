"""SIGKILL to a `sweep --executor ray` CLI (the OOM killer's way: no code of it runs any more): the watcher it
started ends every process of its local Ray instance and removes the instance's folder (one Ray start here)."""
from __future__ import annotations

import signal
import time

import pytest

pytest.importorskip("ray")
pytest.importorskip("psutil")

from tests.cli.ray_helpers import (
    cmdline,
    session_folder,
    start_ray_sweep,
    survivors,
    wait_for_workers,
)


def test_sigkill_leaves_no_ray_process_behind(tmp_path):
    proc = start_ray_sweep(tmp_path)
    procs = [p for p in wait_for_workers(proc.pid, proc) if "ray_reaper" not in cmdline(p)]
    folder = session_folder(procs)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not survivors(procs, 30)
    deadline = time.time() + 30  # the watcher removes the folder once the last process is gone
    while folder is not None and folder.exists() and time.time() < deadline:
        time.sleep(0.25)
    assert folder is None or not folder.exists()

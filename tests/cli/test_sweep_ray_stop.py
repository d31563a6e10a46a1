"""`sweep --executor ray` on its own local Ray instance (one start in this module): every process of it listens on
loopback only; SIGTERM (as SIGINT) ends the CLI with one line and the instance with it — no process survives, its
private folder is removed."""
from __future__ import annotations

import signal

import pytest

pytest.importorskip("ray")
pytest.importorskip("psutil")

from tests.cli.ray_helpers import (
    LOOPBACK,
    listening,
    session_folder,
    start_ray_sweep,
    survivors,
    wait_for_workers,
)


def test_loopback_only_and_sigterm_ends_the_sweep_and_its_ray_instance(tmp_path):
    proc = start_ray_sweep(tmp_path)
    procs = wait_for_workers(proc.pid, proc)
    addresses = listening(procs + [__import__("psutil").Process(proc.pid)])
    folder = session_folder(procs)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert addresses and addresses <= LOOPBACK, addresses
    assert proc.returncode == 130, err[-3000:]
    assert err.splitlines()[-1].startswith("error: sweep interrupted") and "Traceback" not in err, err[-3000:]
    assert not survivors(procs, 15)
    assert folder is not None and folder.name.startswith("ram-studio-ray-") and not folder.exists()
    assert not (tmp_path / "home" / ".ray").exists()  # the token came through the environment

"""`sweep --executor ray` with the local instance it starts itself (one start in this module, in this process):
every Ray process of it listens on loopback only and runs with token authentication (a token in the environment:
nothing written to ~/.ray), its workers at the command's own priority; the workers killed mid-sweep (as the OOM
killer would) end the command with one line saying how many scores are kept; nothing of the instance survives the
command; the sweep then resumes from the kept scores."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.cli_helpers import run

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from tests.cli.ray_helpers import (  # noqa: E402
    LOOPBACK,
    cmdline,
    descendants,
    listening,
    session_folder,
    survivors,
)

SWEEP = ["sweep", "demo:base", "demo:code", "demo:tool", "--try", "task_arithmetic lambda=0.1,0.3,0.5,0.7,0.9,1.1",
         "--tasks", "code", "--limit", "4", "--quiet"]


class Killer(threading.Thread):
    """Once the sweep has stored a score: stop every worker at once (SIGSTOP, so that the scorings still queued or
    running cannot finish while we look), note the Ray processes (this process's descendants), their sockets and a
    worker's environment, then SIGKILL the workers, as the OOM killer would. The store is polled cheaply and the
    workers stopped right after the first score, while most of the sweep remains: killing one worker later could find
    the sweep's last scorings on the other one and the command ending well."""

    def __init__(self, store: Path) -> None:
        super().__init__(daemon=True)
        self.store, self.seen = store, {}

    def run(self) -> None:
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.store.is_dir() and any(self.store.glob("*.json")):
                kids = descendants(os.getpid())
                workers = [k for k in kids if "WorkerActor" in cmdline(k)]
                for w in workers:
                    os.kill(w.pid, signal.SIGSTOP)
                self.seen.update(procs=kids, folder=session_folder(kids), env=workers[0].environ(),
                                 listening=listening(kids + [psutil.Process()]),
                                 stored=len(list(self.store.glob("*.json"))), nice={w.nice() for w in workers})
                for w in workers:
                    os.kill(w.pid, signal.SIGKILL)
                return
            time.sleep(0.02)


def test_a_killed_worker_is_one_line_nothing_survives_and_the_sweep_resumes(capsys, tmp_path, monkeypatch):
    for var in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # where Ray would write ~/.ray/auth_token
    store = tmp_path / "store"
    monkeypatch.setenv("RAM_STUDIO_SWEEP_CACHE", str(store))
    killer = Killer(store)
    killer.start()
    code, _, err = run(capsys, *SWEEP, "--executor", "ray")
    killer.join(timeout=5)
    seen = killer.seen
    assert seen, "no worker was seen"
    assert code == 2 and "a Ray worker was lost while scoring" in err and "done so far are kept" in err, err
    assert "Run the same command again to resume" in err
    assert seen["listening"] and seen["listening"] <= LOOPBACK, seen["listening"]
    assert seen["env"].get("RAY_AUTH_MODE") == "token" and len(seen["env"].get("RAY_AUTH_TOKEN", "")) == 64
    assert not (tmp_path / "home" / ".ray").exists()
    assert seen["nice"] == {os.nice(0)}, "the workers run at the command's own priority"
    assert not survivors([p for p in seen["procs"] if "ray_reaper" not in cmdline(p)], 15)
    assert seen["folder"].name.startswith("ram-studio-ray-") and not seen["folder"].exists()
    report = tmp_path / "resumed.json"
    code, _, err = run(capsys, *SWEEP, "--json", report)
    assert code == 0, err
    doc = json.loads(report.read_text())
    assert sum(e["resumed"] for e in doc["candidates"] + doc["references"]) >= seen["stored"] >= 1

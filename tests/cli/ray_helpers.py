"""Helpers of the tests that stop or kill a `sweep --executor ray` process: the Ray processes it started (its
descendants, snapshotted while it runs, each with its start time so a reused PID is never mistaken for one)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


def start_ray_sweep(tmp_path: Path) -> subprocess.Popen:
    """A small `sweep --executor ray` in its own process (its own score store, HOME in the test's folder)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAM_STUDIO_SWEEP_CACHE": str(tmp_path / "store"),
           "HOME": str(tmp_path / "home")}
    for var in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "ram_studio", "sweep", "demo:base", "demo:code", "demo:tool", "--try",
           "task_arithmetic lambda=0.1,0.3,0.5,0.7,0.9,1.1,1.3,1.5", "--tasks", "code,memory", "--limit", "8",
           "--executor", "ray"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def cmdline(p: psutil.Process) -> str:
    """A process's command line, "" once it is gone."""
    try:
        return " ".join(p.cmdline())
    except (psutil.Error, OSError):
        return ""


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def wait_for_workers(root: int, proc: subprocess.Popen | None = None, timeout: float = 400) -> list[psutil.Process]:
    """Once Ray workers run under process `root`: every process below it (psutil objects remember start times)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
        kids = descendants(root)
        if any("WorkerActor" in cmdline(k) for k in kids):
            time.sleep(1.0)  # the rest of the instance (agents) is up by now
            return descendants(root)
        time.sleep(0.3)
    raise AssertionError("no Ray worker started")


def listening(procs: list[psutil.Process]) -> set[str]:
    out = set()
    for p in procs:
        try:
            out |= {c.laddr.ip for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
    return out


def survivors(procs: list[psutil.Process], timeout: float) -> list[str]:
    """The processes among `procs` still running after `timeout` seconds (zombies count as ended)."""
    deadline = time.time() + timeout
    while True:
        alive = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{p.pid} {p.name()}")
            except psutil.Error:
                pass
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.25)


def session_folder(procs: list[psutil.Process]) -> Path | None:
    """The instance's folder (its raylet's --temp_dir), if a raylet is among them."""
    for p in procs:
        for arg in cmdline(p).split():
            if arg.startswith("--temp_dir="):
                return Path(arg.split("=", 1)[1])
    return None

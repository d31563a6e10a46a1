"""Faults lose nothing: read-only inputs stay unchanged, killed/failed/cancelled merges leave no model."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from merging.common.errors import MergeCancelled
from merging.merge import merge_to_folder
from merging.recipe import MergeSpec
from ram_studio.cli import main
from tests.factory import checksums
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


def no_model_left(out: Path) -> None:
    """Neither the target nor any leftover temp folder may look like a loadable model."""
    assert not out.exists()
    for p in out.parent.iterdir():
        if ".partial-" in p.name:
            assert not (p / "config.json").exists() and not (p / "model.safetensors.index.json").exists()


def slow_merge_cmd(family, out: Path) -> list[str]:
    base, agents = family
    return [sys.executable, "-m", "merging", "merge", str(base), *map(str, agents), "--method", "dare_ties",
            "--out", str(out), "--chunk-elems", "2048", "--quiet"]


def wait_for_partial_shard(out: Path, proc: subprocess.Popen, timeout: float = 120) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "merge finished before it could be interrupted"
        for p in out.parent.glob(f".{out.name}.partial-*"):
            shards = list(p.glob("*.safetensors"))
            if shards and shards[0].stat().st_size > 0:
                return p
        time.sleep(0.05)
    raise AssertionError("no partial output appeared")


def test_sigkill_leaves_no_model_and_inputs_unchanged(slow_family, tmp_path):
    base, agents = slow_family
    before = checksums([base, *agents])
    out = tmp_path / "killed"
    proc = subprocess.Popen(slow_merge_cmd(slow_family, out), cwd=ROOT)
    partial = wait_for_partial_shard(out, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    no_model_left(out)
    assert partial.exists()  # SIGKILL cannot clean up, but the leftover is hidden and incomplete
    assert checksums([base, *agents]) == before
    # The next merge into the same target removes the dead process's leftover and succeeds.
    base, agents = slow_family
    code = main(["merge", str(base), *map(str, agents), "--method", "ram", "--out", str(out), "--quiet"])
    assert code == 0 and (out / "model.safetensors").exists()
    assert not partial.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_clean_up(slow_family, tmp_path, sig):
    out = tmp_path / "stopped"
    proc = subprocess.Popen(slow_merge_cmd(slow_family, out), cwd=ROOT, stderr=subprocess.PIPE, text=True)
    partial = wait_for_partial_shard(out, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not partial.exists()
    no_model_left(out)


def test_second_signal_interrupts_at_once(slow_family, tmp_path):
    """The first signal asks for a stop at the next chunk; a second one interrupts immediately."""
    out = tmp_path / "stopped-twice"
    proc = subprocess.Popen(slow_merge_cmd(slow_family, out), cwd=ROOT, stderr=subprocess.PIPE, text=True)
    partial = wait_for_partial_shard(out, proc)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not partial.exists()
    no_model_left(out)


def test_read_only_inputs_are_never_written(slow_family, tmp_path):
    base, agents = slow_family
    before = checksums([base, *agents])
    modes = {}
    for folder in [base, *agents]:
        for p in folder.iterdir():
            modes[p] = p.stat().st_mode
            p.chmod(0o444)
    try:
        for method in (["--method", "ram_plus"], ["--method", "ties", "--density", "0.2"]):
            out = tmp_path / method[1]
            assert main(["merge", str(base), *map(str, agents), *method, "--out", str(out), "--quiet"]) == 0
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    assert checksums([base, *agents]) == before


def test_cancel_from_another_thread(family, tmp_path):
    base, agents = family
    cancel = threading.Event()
    out = tmp_path / "cancelled"

    def progress(p):
        cancel.set()  # cancel as soon as the first progress report arrives

    spec = MergeSpec(str(base), [str(a) for a in agents], "ties", {"density": 0.2}, str(out), chunk_elems=64)
    with pytest.raises(MergeCancelled):
        merge_to_folder(spec, progress=progress, cancel=cancel)
    no_model_left(out)
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_write_error_midway_is_handled_like_cancel(family, tmp_path, monkeypatch, capsys):
    import merging.writing.shards as writer

    calls = {"n": 0}
    original = writer.ShardSetWriter.write_at

    def failing_write(self, name, offset, data):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, name, offset, data)

    monkeypatch.setattr(writer.ShardSetWriter, "write_at", failing_write)
    base, agents = family
    out = tmp_path / "full"
    code = main(["merge", str(base), *map(str, agents), "--method", "ram", "--out", str(out), "--quiet"])
    assert code == 1 and "No space left" in capsys.readouterr().err
    no_model_left(out)
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_not_enough_disk_space_detected_before_writing(family, tmp_path, monkeypatch, capsys):
    import shutil as sh

    import merging.merge as export

    real = sh.disk_usage
    monkeypatch.setattr(export.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    base, agents = family
    out = tmp_path / "nospace"
    assert main(["merge", str(base), *map(str, agents), "--method", "ram", "--out", str(out), "--quiet"]) == 2
    assert "not enough disk space" in capsys.readouterr().err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_corrupt_cache_entry_is_rebuilt(family):
    from analysis import cache
    from analysis.stats import analyze

    base, agents = family
    first = analyze(base, agents, ladder=(0, 1e-5))
    assert not first.from_cache
    second = analyze(base, agents, ladder=(0, 1e-5))
    assert second.from_cache and second.frame.equals(first.frame)
    import pandas as pd

    from analysis.cache_format import encode

    entry = cache.cache_dir() / f"{first.fingerprint}{cache.SUFFIX}"
    whole = entry.read_bytes()
    entry.write_bytes(whole[:len(whole) // 2])  # truncated
    third = analyze(base, agents, ladder=(0, 1e-5))
    assert not third.from_cache and third.frame.equals(first.frame)
    meta = {"version": cache.CACHE_VERSION, "key": first.fingerprint, "base": "b", "agents": ["a"], "ladder": [0.0],
            "total_params": 1, "seconds": 0.0}
    entry.write_bytes(b"".join(encode(meta, {"frame": pd.DataFrame(), "pairs": pd.DataFrame()},
                                      {})))  # well formed, empty
    fourth = analyze(base, agents, ladder=(0, 1e-5))
    assert not fourth.from_cache and fourth.frame.equals(first.frame)


def test_two_processes_share_the_cache_safely(family, tmp_path):
    base, agents = family
    env = {**os.environ, "RAM_STUDIO_CACHE": str(tmp_path / "shared-cache")}
    cmd = [sys.executable, "-m", "merging", "analyze", str(base), *map(str, agents), "--eps-ladder", "0,1e-5",
           "--quiet", "--json"]
    procs = [subprocess.Popen(cmd + [str(tmp_path / f"{i}.json")], cwd=ROOT, env=env, stderr=subprocess.PIPE)
             for i in range(2)]
    for p in procs:
        assert p.wait(300) == 0, p.stderr.read()
    docs = [json.loads((tmp_path / f"{i}.json").read_text())["agents"] for i in range(2)]
    assert docs[0] == docs[1]
    from analysis.cache import SUFFIX
    from analysis.cache_format import decode

    entries = list((tmp_path / "shared-cache").glob(f"*{SUFFIX}"))
    assert len(entries) == 1 and len(decode(entries[0].read_bytes())[1]["frame"])
    assert not list((tmp_path / "shared-cache").glob("*.tmp"))

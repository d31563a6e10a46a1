"""`sweep --json/--csv` written minutes after they were checked: a file that appears at the path meanwhile is never
replaced (with or without --overwrite), and the report's folder swapped for a link into an input model during the
run never puts the report inside the input. A real sweep in a real process; the change happens once it runs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.factory import checksums

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "assets" / "demo" / "models"


def sweep_until_running(models: list[Path], tmp_path: Path, extra: list[str]) -> subprocess.Popen:
    """Start a small sweep and return once it reports its first progress (its outputs are checked by then)."""
    cmd = [sys.executable, "-m", "ram_studio", "sweep", *map(str, models), "--try", "task_arithmetic lambda=0.5,1.0",
           "--tasks", "code", "--limit", "6", "--no-references", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stderr.readline()
        if line.startswith("sweep: "):
            return proc
        assert line or proc.poll() is None, "the sweep ended before it started scoring"
    proc.kill()
    raise AssertionError("the sweep did not start")


@pytest.fixture()
def models(tmp_path):
    """Copies of three demo models (inputs this test may point links at)."""
    return [shutil.copytree(DEMO / name, tmp_path / "models" / name) for name in ("base", "code", "tool")]


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_report_that_appeared_during_the_sweep_is_not_replaced(models, tmp_path, overwrite):
    report = tmp_path / "scores.json"
    proc = sweep_until_running(models, tmp_path, ["--json", str(report)] + (["--overwrite"] if overwrite else []))
    report.write_text("another writer's result")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err[-2000:]
    assert err.splitlines()[-1].startswith("error: ") and "appeared while this command ran" in err
    assert report.read_text() == "another writer's result"
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_the_reports_folder_swapped_for_a_link_into_an_input_gets_nothing(models, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    before = checksums(models)
    proc = sweep_until_running(models, tmp_path, ["--json", str(reports / "scores.json"),
                                                  "--csv", str(reports / "scores.csv")])
    reports.rename(tmp_path / "reports-checked")
    reports.symlink_to(models[1])  # the folder the reports go to is now the code agent
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err[-2000:]
    assert "changed while this command ran" in err.splitlines()[-1]
    assert checksums(models) == before
    assert not list(tmp_path.rglob("scores.*"))

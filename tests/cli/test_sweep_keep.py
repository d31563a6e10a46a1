"""A sweep whose --keep fails (another writer owns the kept model's folder) still writes its --json/--csv reports,
with the failure in them, then says so in one line and exits 2; the scores stay stored."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from evaluation.grid import parse_try
from evaluation.keep import folder_for
from merging.writing.commit import TargetLock
from tests.cli_helpers import run


def test_reports_are_written_when_keep_fails(capsys, tmp_path: Path):
    root = tmp_path / "kept"
    root.mkdir()
    (candidate,) = parse_try("task_arithmetic lambda=0.5").expand()
    target = folder_for("demo:base", ["demo:code", "demo:tool"], candidate, "error", root)
    report, table = tmp_path / "scores.json", tmp_path / "scores.csv"
    with TargetLock(target, "another writer's merge"):  # held by "another writer" the whole time
        code, out, err = run(capsys, "sweep", "demo:base", "demo:code", "demo:tool", "--try",
                             "task_arithmetic lambda=0.5", "--tasks", "code", "--limit", "3", "--keep", "best",
                             "--out", root, "--json", report, "--csv", table, "--quiet")
    assert code == 2 and "--keep best: 1 of 1 model(s) could not be written" in err, err
    assert "another merge is writing" in err and "reports name what was not written" in err
    doc = json.loads(report.read_text())
    assert doc["kept"] == [] and doc["best"] == "task_arithmetic lambda=0.5"
    (failure,) = doc["keep_failed"]
    assert failure["candidate"] == "task_arithmetic lambda=0.5" and failure["out"] == str(target)
    assert "another merge is writing" in failure["error"]
    rows = list(csv.DictReader(table.open()))
    assert [r["kept"] for r in rows if r["candidate"] == "task_arithmetic lambda=0.5"][0].startswith("not kept: ")
    assert not target.exists() and "not kept task_arithmetic lambda=0.5" in out
    code, out, err = run(capsys, "sweep", "demo:base", "demo:code", "demo:tool", "--try", "task_arithmetic lambda=0.5",
                         "--tasks", "code", "--limit", "3", "--keep", "best", "--out", root, "--json", report,
                         "--overwrite", "--quiet")
    assert code == 0, err  # the folder is free now: the scores are resumed, the model is kept
    doc = json.loads(report.read_text())
    assert doc["kept"] == [str(target)] and doc["keep_failed"] == [] and (target / "config.json").is_file()
    assert all(e["resumed"] for e in doc["candidates"] + doc["references"])

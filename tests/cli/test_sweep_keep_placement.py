"""The folder `sweep --keep` writes its kept models into follows the placement rules of every output: refused before
the sweep starts when it is, contains or lies inside an input, and checked again when each kept model is written —
a folder swapped for a link into an input during the sweep gets nothing (the scores and reports are still written)."""
from __future__ import annotations

import json

from tests.cli.test_sweep_outputs import models, sweep_until_running  # noqa: F401 — the fixture, shared
from tests.cli_helpers import run
from tests.factory import checksums


def test_a_keep_folder_inside_an_input_is_refused_before_the_sweep(capsys, tmp_path, models):  # noqa: F811
    before = checksums(models)
    code, _, err = run(capsys, "sweep", *map(str, models), "--try", "task_arithmetic lambda=0.5", "--tasks", "code",
                       "--limit", "3", "--keep", "best", "--out", models[1] / "kept", "--quiet")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "inside the input" in lines[0], err
    assert "sweep:" not in err and checksums(models) == before and not (models[1] / "kept").exists()


def test_a_keep_folder_swapped_for_a_link_into_an_input_gets_nothing(tmp_path, models):  # noqa: F811
    root, report = tmp_path / "kept", tmp_path / "scores.json"
    root.mkdir()
    before = checksums(models)
    proc = sweep_until_running(models, tmp_path, ["--keep", "best", "--out", str(root), "--json", str(report)])
    root.rename(tmp_path / "kept-checked")
    root.symlink_to(models[1])  # the kept models' folder is now the code agent
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err[-2000:]
    assert "--keep best: 1 of 1 model(s) could not be written" in err and "inside the input" in err, err[-2000:]
    assert checksums(models) == before  # every file of the inputs, by path: nothing added, changed or removed
    doc = json.loads(report.read_text())
    assert doc["kept"] == [] and len(doc["keep_failed"]) == 1 and list((tmp_path / "kept-checked").iterdir()) == []

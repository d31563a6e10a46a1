"""The sweep's score store: an entry with the right key but damaged content (a string average, scores that are
not a map, detail nested 100,000 deep, a FIFO, a link, a huge file) is ignored, reported once and scored again;
the store folder ($RAM_STUDIO_SWEEP_CACHE) is never an input, inside one or around one."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.cli_helpers import run
from tests.factory import checksums

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "assets" / "demo" / "models"
SWEEP = ["sweep", "demo:base", "demo:code", "demo:tool", "--try", "task_arithmetic lambda=0.5,1.0,1.5",
         "--tasks", "code", "--limit", "3", "--quiet"]


def entries(store: Path) -> list[Path]:
    return sorted(p for p in store.iterdir() if p.suffix == ".json" and not p.name.startswith("."))


def damage(path: Path, how: str, tmp_path: Path) -> None:
    """Keep the entry's key, break its content."""
    doc = json.loads(path.read_text())
    if how == "string-average":
        doc["result"]["average"] = "ninety"
    elif how == "scores-list":
        doc["result"]["scores"] = [1, 2]
    elif how == "deep-detail":
        path.write_text(json.dumps(doc)[:-2] + ', "detail": ' + "[" * 100_000 + "]" * 100_000 + "}}")
        return
    elif how == "nan-score":
        doc["result"]["scores"] = {"code": "NaN"}
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
        return
    elif how == "link":
        (tmp_path / "elsewhere.json").write_text(json.dumps(doc))
        path.unlink()
        path.symlink_to(tmp_path / "elsewhere.json")
        return
    elif how == "huge":
        doc["result"]["padding"] = "x" * (5 << 20)
    path.write_text(json.dumps(doc))


def test_damaged_entries_are_ignored_reported_once_and_scored_again(capsys, tmp_path, monkeypatch):
    store = tmp_path / "store"
    monkeypatch.setenv("RAM_STUDIO_SWEEP_CACHE", str(store))
    report = tmp_path / "first.json"
    code, out, err = run(capsys, *SWEEP, "--json", report)
    assert code == 0, err
    first = json.loads(report.read_text())
    files = entries(store)
    kinds = ["string-average", "scores-list", "deep-detail", "nan-score", "fifo", "link", "huge"]
    assert len(files) >= len(kinds)
    for path, how in zip(files, kinds):
        damage(path, how, tmp_path)
    report2 = tmp_path / "second.json"
    code, out, err = run(capsys, *SWEEP, "--json", report2)
    assert code == 0, err
    notes = [line for line in out.splitlines() if "damaged score store" in line]
    assert len(notes) == 1 and f"{len(kinds)} damaged score store entries" in notes[0], out
    second = json.loads(report2.read_text())
    rows = lambda doc: doc["candidates"] + doc["references"]  # noqa: E731
    assert sum(1 for e in rows(second) if not e["resumed"]) == len(kinds)
    strip = lambda doc: [{k: v for k, v in e.items() if k not in ("resumed", "merge_s", "eval_s")}  # noqa: E731
                         for e in rows(doc)]
    assert strip(second) == strip(first)  # scored again: the same scores
    assert (tmp_path / "elsewhere.json").read_text().count("{") > 0  # a link's target is never written through
    code, out, err = run(capsys, *SWEEP)
    assert code == 0 and "damaged" not in out  # the rewritten entries are whole again


@pytest.mark.parametrize("where", ["is", "inside", "around"])
def test_the_store_is_never_in_over_or_around_an_input(capsys, tmp_path, monkeypatch, where):
    models = tmp_path / "models"
    copies = [shutil.copytree(DEMO / n, models / n) for n in ("base", "code", "tool")]
    before = checksums(copies)
    store = {"is": copies[1], "inside": copies[0] / "scores", "around": models}[where]
    monkeypatch.setenv("RAM_STUDIO_SWEEP_CACHE", str(store))
    argv = [a if not a.startswith("demo:") else str(models / a[5:]) for a in SWEEP]
    code, _, err = run(capsys, *argv)
    assert code == 2 and "score store folder" in err and "RAM_STUDIO_SWEEP_CACHE" in err, err
    assert checksums(copies) == before and not (copies[0] / "scores").exists()

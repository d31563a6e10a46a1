"""Every command-line option says what it does; the demo's evaluator prints accuracy in % with its
columns explained and without transformers' loading bars (the app's labels: tests/app/test_state.py)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from ram_studio.cli import build_parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_option_has_help(name):
    parser = subcommands()[name]
    bare = [a.option_strings[0] for a in parser._actions
            if a.option_strings and a.help is None and a.help != argparse.SUPPRESS]
    assert not bare, f"{name}: {bare} have no help text"


def test_quiet_and_shard_size_say_what_they_do():
    text = subcommands()["merge"].format_help()
    assert "--shard-size SIZE" in text and "save_pretrained" in text
    assert "no progress lines on stderr" in text


def test_demo_evaluator_prints_percent_explains_its_columns_and_keeps_stderr_clean(tmp_path):
    from merging.reading.refs import demo_root
    from tests.factory import checksums

    folder = demo_root() / "base"
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the bundled demo is not built")
    before = checksums([folder])
    out = tmp_path / "scores.json"
    run = subprocess.run([sys.executable, "-m", "demo.evaluate", str(folder), "--limit", "4", "--tasks",
                          "code,tool", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    header = lines[1].split()
    assert header[-2:] == ["accuracy", "%"] and "habit" in header and "answers" in header, lines[:2]
    row = lines[2].split()
    assert 0 <= float(row[-1]) <= 100 and row[-1].count(".") == 1 and len(row[-1].split(".")[1]) == 2
    assert any(line.startswith("habit answers: wrong outputs that are exactly") for line in lines)
    assert "Loading" not in run.stderr and "it/s" not in run.stderr, run.stderr
    doc = json.loads(out.read_text())  # the JSON keeps raw counts and fractions
    assert {"habit", "accuracy"} <= set(doc["results"][0]) and 0 <= doc["results"][0]["accuracy"] <= 1
    again = subprocess.run([sys.executable, "-m", "demo.evaluate", str(folder), "--limit", "1", "--json",
                            str(out)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "--overwrite" in again.stderr  # never over a file unasked
    inside = subprocess.run([sys.executable, "-m", "demo.evaluate", str(folder), "--limit", "1", "--json",
                             str(folder / "config.json"), "--overwrite"], capture_output=True, text=True, timeout=300)
    assert inside.returncode == 2 and checksums([folder]) == before  # never into the model it reads
    helped = subprocess.run([sys.executable, "-m", "demo.evaluate", "--help"], capture_output=True, text=True)
    for flag in ("--tasks", "--split", "--limit", "--suite", "--json", "--overwrite"):
        assert flag in helped.stdout
    assert "Accuracy is printed in %" in helped.stdout

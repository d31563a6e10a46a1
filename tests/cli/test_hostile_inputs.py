"""Hostile files get one clear line and never a traceback, and text from files is data: malformed configs and
safetensors, pickles never unpickled, control characters, bidi marks and formula cells escaped for the terminal and
CSV. Rows of the "Trust" table in docs/security.md."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.cli_helpers import (
    HOSTILE_TENSORS,
    hostile_family,
    main_capture,
    merge_argv,
    run,
)
from tests.factory import join_safetensors, split_safetensors
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


# --- 6. no traceback, ever ------------------------------------------------------------------------------

@pytest.mark.parametrize("content,fragment",
                         [("[1, 2]", "JSON list"), ('"qwen2"', "JSON str"), ("{", "not valid JSON")])
def test_config_that_is_not_an_object(capsys, models, content, fragment):
    base, agents = models
    (agents[0] / "config.json").write_text(content)
    for argv in (["inspect", base, *agents], ["analyze", base, *agents, "--quiet"]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and fragment in err and "config.json" in err, err


def _rewrite(shard: Path, edit_header, tail: bytes = b"", gap: int = 0) -> None:
    header, data = split_safetensors(shard)
    edit_header(header)
    join_safetensors(shard, header, b"\0" * gap + data + tail)


def _first(h):
    return next(k for k in h if k != "__metadata__")


def _shift_all(h, by):
    for k, v in h.items():
        if k != "__metadata__":
            v["data_offsets"] = [o + by for o in v["data_offsets"]]


@pytest.mark.parametrize("case,edit,tail,gap,fragment", [
    ("trailing bytes", lambda h: None, b"\0" * 16, 0, "bytes after its last tensor"),
    ("gap before data", lambda h: _shift_all(h, 8), b"", 8, "gap of 8 bytes"),
    ("non-string metadata", lambda h: h.update({"__metadata__": {"format": 1}}), b"", 0, "__metadata__"),
    ("boolean dimension", lambda h: h[_first(h)].update(shape=[True] * len(h[_first(h)]["shape"])), b"", 0,
     "invalid shape"),
    ("2^64 dimension", lambda h: h[_first(h)].update(shape=[2 ** 64, 0]), b"", 0, "invalid shape"),
])
def test_malformed_safetensors_are_refused_by_inspect_and_merge(capsys, models, tmp_path, case, edit, tail, gap,
                                                                fragment):
    base, agents = models
    shard = sorted(agents[1].glob("*.safetensors"))[0]
    _rewrite(shard, edit, tail, gap)
    for argv in (["inspect", base, *agents], merge_argv(base, agents, tmp_path / "out")):
        code, _, err = run(capsys, *argv)
        assert code == 2 and fragment in err and shard.name in err, (case, err)


class _Trap:
    """Unpickling this creates a marker file: proof that something was unpickled."""

    marker = ""

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_evaluate_never_unpickles(capsys, tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    marker = tmp_path / "UNPICKLED"
    trap = _Trap()
    trap.marker = str(marker)
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(trap))
    code, _, err = run(capsys, "evaluate", folder, "--limit", "1")
    assert code == 2 and "pickle" in err and not marker.exists()


def test_control_characters_in_names_are_escaped(capsys, tmp_path):
    names = ["model.\x1b[31mred\x1b[0m.weight", "model.\u202eevil.weight"]
    folders = []
    for i in range(3):
        f = tmp_path / f"m{i}"
        f.mkdir()
        save_file({n: torch.full((4,), float(i + j)) for j, n in enumerate(names)}, f / "model.safetensors")
        (f / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
        folders.append(f)
    save_file({names[1]: torch.zeros(4)}, folders[2] / "model.safetensors")  # the mismatch names the ESC tensor
    code, out, err = run(capsys, "inspect", *folders)
    assert code == 2 and "\\x1b" in out + err and "\x1b" not in err + out and "\u202e" not in err + out, err
    code, out, err = run(capsys, "inspect", *folders[:2], folders[1].parent / "m0")
    assert "\x1b" not in out + err


# --- 4. text from files is data --------------------------------------------------------------------------

def test_terminal_lines_escape_paths_and_names(capsys, models, tmp_path):
    """The "wrote …" line printed raw escape sequences from --out (window title set, screen
    cleared); every line the CLI prints is escaped."""
    base, agents = models
    out = tmp_path / "m\x1b]0;pwned\x07\x1b[2J\u202eevil"
    code, stdout, err = main_capture(capsys, *merge_argv(base, agents, out))
    assert code == 0, err
    assert "\x1b" not in stdout + err and "\x07" not in stdout + err and "\u202e" not in stdout + err
    assert "\\x1b]0;pwned\\x07" in stdout and "\\u202e" in stdout
    code, stdout, err = main_capture(capsys, "run", out / "ram_recipe.json", "--out", str(out) + "-again", "--quiet")
    assert code == 0 and "\x1b" not in stdout + err, err


def test_csv_cells_never_run_as_formulas(capsys, tmp_path):
    """Tensor names starting with = + - @ were written raw into CSV (formula injection), and
    bidi characters raw."""
    import csv

    folders = hostile_family(tmp_path)
    out = tmp_path / "stats.csv"
    code, _, err = run(capsys, "analyze", *folders, "--csv", out, "--quiet")
    assert code == 0, err
    text = out.read_text()
    assert "\u202e" not in text and "\\u202e" in text
    rows = list(csv.DictReader(text.splitlines()))
    tensors = {r["tensor"] for r in rows}
    assert len(tensors) == len(HOSTILE_TENSORS)
    for cell in tensors:
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
    assert "'=HYPERLINK(\"http://evil.example/x\",\"click\")" in tensors and "'-2+3" in tensors
    assert all(not r["agent"].startswith(("=", "+", "-", "@")) for r in rows)

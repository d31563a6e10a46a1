"""Grid files and --try texts are bounded before any work: a 100,000-deep YAML file, a ~0.7 MB file listing
145,000 values and a --try of 145,000 values are refused in one line (the counts checked first, in linear time),
with the bounded YAML reader the mergekit panel uses; a legitimate grid of 9,000 repeated values is read."""
from __future__ import annotations

import pytest

from evaluation.grid import grids_from_yaml, parse_try
from merging.common.errors import RamStudioError
from tests.test_trust import run

VALUES = ",".join(f"{(i % 997) / 1000:.3f}"[1:] for i in range(145_000))  # ".123,": the issue's ~6 bytes a value


@pytest.mark.parametrize("text,fragment", [
    ("grids: " + "[" * 100_000 + "]" * 100_000, "nested more than 64 levels deep"),
    ("grids:\n  - method: task_arithmetic\n    lambda: [" + VALUES + "]\n", "lists about 145,00"),
    ("grids:\n  - {method: ties, lambda: !!python/object/apply:os.system [echo]}", "uses a YAML tag"),
])
def test_a_hostile_grid_file_is_one_line(capsys, tmp_path, text, fragment):
    path = tmp_path / "grids.yaml"
    path.write_text(text)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(RamStudioError, match=fragment):
        grids_from_yaml(text, str(path))
    code, _, err = run(capsys, "sweep", "demo:base", "demo:code", "demo:tool", "--grids", path, "--tasks", "code")
    assert code == 2 and fragment in err, err


def test_a_try_of_145000_values_is_refused_by_its_count(capsys):
    with pytest.raises(RamStudioError, match="lists 145,000 values, more than 10,000"):
        parse_try("task_arithmetic lambda=" + VALUES)
    with pytest.raises(RamStudioError, match="too long"):
        parse_try("task_arithmetic lambda=" + ",".join(["1"] * 200_000))
    with pytest.raises(RamStudioError, match="cannot read --try"):
        parse_try("task_arithmetic lambda='0.5" + ",0.5" * 5000 + "'")  # quoting in a long text: never shlex


def test_repeated_values_are_read_in_one_pass():
    grid = parse_try("task_arithmetic lambda=" + ",".join(["0.5", "1.0"] * 4500))
    assert grid.size() == 2 and grid.text == "task_arithmetic lambda=0.5,1.0"
    (g,) = grids_from_yaml("grids:\n  - method: task_arithmetic\n    lambda: [" + ", ".join(["0.25"] * 9000) + "]\n")
    assert g.text == "task_arithmetic lambda=0.25"

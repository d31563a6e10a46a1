"""`analyze --eps-ladder` is bounded: more than 64 values of ε (3,000 once took 298 s and 1.2 GB on the demo) are
refused in one line before anything is read; 64 are accepted."""
from __future__ import annotations

from tests.cli_helpers import run


def test_an_eps_ladder_longer_than_64_is_refused_before_the_pass(capsys):
    ladder = ",".join(f"{i}e-7" for i in range(3000))
    code, _, err = run(capsys, "analyze", "demo:base", "demo:code", "demo:tool", "--eps-ladder", ladder, "--quiet")
    assert code == 2 and "3,000 values, more than 64" in err, err


def test_a_ladder_of_64_runs(capsys):
    ladder = ",".join(f"{i}e-6" for i in range(64))
    code, out, err = run(capsys, "analyze", "demo:base", "demo:code", "--eps-ladder", ladder, "--eps", "1e-05",
                         "--no-cache", "--quiet")
    assert code == 0 and "ε = 1e-05" in out, err

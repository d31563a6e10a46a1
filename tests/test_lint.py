"""The tree is clean under ruff with the rule set pyproject.toml defines (`.ci/run` also runs it, before the suite)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    if importlib.util.find_spec("ruff") is None:
        if os.environ.get("CI"):
            pytest.fail("ruff is not installed: it is in the test extras (pip install -r requirements-test.txt)")
        pytest.skip("ruff is not installed (pip install -r requirements-test.txt)")
    # --no-cache: a .ruff_cache folder would be a new entry in the checkout's root
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr

"""Compiling kernels on the warm-up thread never rebinds the process's sys.stdout / sys.stderr."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_numba_error_colouring_cannot_swap_the_output_streams():
    """numba's error colouring calls colorama's init/deinit, which set sys.stderr back to the stream numba first
    saw — from whichever thread compiles. A notebook's or a test's captured stderr then went to the terminal."""
    script = textwrap.dedent("""
        import io, sys
        import os
        import merging.kernels.common  # imports numba, as every kernel module does
        import numba.core.errors as errors
        assert "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING" not in os.environ  # numba's switch, for its import only
        mine_out, mine_err = io.StringIO(), io.StringIO()
        sys.stdout, sys.stderr = mine_out, mine_err
        # What numba runs while it formats a typing error during a compile. With colouring on, each call saves
        # the streams of that moment and restores them afterwards; another thread's swap in between is undone.
        plain = errors.termcolor().errmsg("x") == "x"
        ok = plain and sys.stdout is mine_out and sys.stderr is mine_err
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        print("kept" if ok else "swapped")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "kept"


def test_every_kernel_module_imports_numba_through_the_quiet_import():
    """A module (or a test: pytest imports every test module first) that imports numba or a part of it itself
    could be the first to, with the colouring on (sorted imports put `from numba.core import …` before
    `from merging.kernels.numba_import import …`): every part of numba comes from numba_import."""
    import ast

    direct = []
    for path in sorted([*(REPO / "merging").rglob("*.py"), *(REPO / "tests").rglob("*.py")]):
        if path.name == "numba_import.py":
            continue
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "numba" for a in node.names):
                direct.append(f"{path.relative_to(REPO)}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "numba":
                direct.append(f"{path.relative_to(REPO)}:{node.lineno}")
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip" and node.args \
                    and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).split(".")[0] == "numba":
                direct.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not direct, direct

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

"""numba, imported with its error colouring off; every kernel module imports numba from here.

numba colours its error messages through colorama, whose init/deinit set sys.stdout and sys.stderr for the whole
process back to the streams of an earlier moment. numba does that while it compiles, and it compiles on the
kernels' warm-up thread, so a notebook's, a server's or a test's captured output was swapped back to the terminal
at random. numba reads its switch once, when it is first imported: it is set for that import only, and the
environment is left as it was. (If numba was imported before any kernel module, its colouring stays as it was.)
The parts of numba the kernels use are imported here too, so that no import-sorting can put a numba import
before this one.
"""
from __future__ import annotations

import os

_SWITCH = "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"
_before = os.environ.get(_SWITCH)
os.environ[_SWITCH] = "1"
try:
    import numba
    from numba.core import types
    from numba.extending import intrinsic, overload
finally:
    if _before is None:
        os.environ.pop(_SWITCH, None)
    else:
        os.environ[_SWITCH] = _before

__all__ = ["intrinsic", "numba", "overload", "types"]

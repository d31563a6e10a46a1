"""The one exception type users see: a clear message plus what to do about it, printable as one line."""
from __future__ import annotations

import re

# C0/C1 control characters, DEL, and Unicode controls that reorder or hide text (bidi overrides, zero-width).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def printable(text: object, limit: int | None = None) -> str:
    """`text` with every control character escaped (\\x1b, \\n, \\u202e, …), optionally shortened: names
    and values read from files go through this before they reach a terminal or a page."""
    s = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))
    if limit is not None and len(s) > limit:
        s = s[:limit] + "…"
    return s


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message as one printable line without a final period (its type name when empty), for
    wrapping a third-party error into our own sentence."""
    text = str(exc).strip()
    line = text.splitlines()[0].rstrip(". ") if text else type(exc).__name__
    return printable(line, limit)


class RamStudioError(Exception):
    """A user-facing error: `message` says what is wrong, `hint` what to do about it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = printable(message)
        self.hint = printable(hint)

    def __str__(self) -> str:
        return f"{self.message} {self.hint}".strip() if self.hint else self.message


class Cancelled(RamStudioError):
    """A long operation (merge, analysis, download) stopped because the caller asked it to."""

    def __init__(self, message: str = "cancelled.", hint: str = "") -> None:
        super().__init__(message, hint)


class MergeCancelled(Cancelled):
    """Raised inside the engine when the caller asked to stop; nothing is left on disk."""

    def __init__(self) -> None:
        super().__init__("merge cancelled; no output was written.")

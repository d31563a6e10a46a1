"""The one exception type users see: a clear message plus what to do about it, printable as one line."""
from __future__ import annotations

from merging.common.escaping import printable

__all__ = ["Cancelled", "MergeCancelled", "RamStudioError", "printable"]


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

    def _render_traceback_(self) -> list[str]:
        """How IPython and Jupyter show it: the one line the CLI prints, not a traceback (a user error)."""
        return [f"{type(self).__name__}: {self}"]


class Cancelled(RamStudioError):
    """A long operation (merge, analysis, download) stopped because the caller asked it to."""

    def __init__(self, message: str = "cancelled.", hint: str = "") -> None:
        super().__init__(message, hint)


class MergeCancelled(Cancelled):
    """Raised inside the engine when the caller asked to stop; nothing is left on disk."""

    def __init__(self) -> None:
        super().__init__("merge cancelled; no output was written.")

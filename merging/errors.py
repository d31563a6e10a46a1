"""The one exception type users see: a clear message plus what to do about it."""
from __future__ import annotations


class RamStudioError(Exception):
    """A user-facing error: `message` says what is wrong, `hint` what to do about it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} {self.hint}".strip() if self.hint else self.message


class MergeCancelled(RamStudioError):
    """Raised inside the engine when the caller asked to stop; nothing is left on disk."""

    def __init__(self) -> None:
        super().__init__("merge cancelled; no output was written.")

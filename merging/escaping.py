"""Text read from files (tensor names, paths, config values, card text) is data: how it is made safe for
each place it is shown. The terminal: control characters and bidi overrides escaped (`printable`). CSV:
the same, and a cell a spreadsheet would run as a formula prefixed with a quote (`csv_bytes`). The app's
Markdown and plotly labels have their own escaping in `app/markup.py`, built on `printable`.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

# C0/C1 control characters, DEL, and Unicode controls that reorder or hide text (bidi overrides, marks and
# isolates, zero-width characters, the line and paragraph separators, the BOM).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
# What a spreadsheet reads as the start of a formula (OWASP: CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def printable(text: object, limit: int | None = None) -> str:
    """`text` with every control character escaped (\\x1b, \\n, \\u202e, …), optionally shortened: names
    and values read from files go through this before they reach a terminal, a page or a CSV."""
    raw = str(text)
    cut = limit is not None and len(raw) > limit
    s = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), raw[:limit] if cut else raw)
    return s + "…" if cut else s


def csv_cell(value: Any) -> Any:
    """A CSV cell that no spreadsheet runs: text escaped like `printable`, and text a spreadsheet would take
    for a formula (starting with = + - @, a tab or a carriage return) prefixed with a quote. Numbers pass."""
    if not isinstance(value, str):
        return value
    text = printable(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def csv_bytes(frame: "pd.DataFrame") -> bytes:
    """`frame` as CSV bytes (no index), every text cell and column name through `csv_cell`."""
    safe = frame.copy()
    for column in safe.columns:
        if not (safe[column].dtype.kind in "biufcmM"):
            safe[column] = safe[column].map(csv_cell)
    safe.columns = [csv_cell(str(c)) for c in safe.columns]
    return safe.to_csv(index=False).encode()

"""Text read from files (tensor names, paths, config values, card text) is data: how it is made safe for
each place it is shown. The terminal: control characters and bidi overrides escaped (`printable`). CSV:
the same, and a cell a spreadsheet would run as a formula prefixed with a quote (`csv_bytes`). Markdown (the
model card here, the app's text through `app/markup.py`): every construct escaped (`markdown_text`,
`markdown_code`, `markdown_fence`). plotly labels have their own escaping in `app/markup.py`."""
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


# Every ASCII punctuation character may be backslash-escaped in CommonMark; escaping all of them leaves no
# construct (link, image, autolink, emphasis, HTML, heading, list, table, directive, math) to start.
_MD_SPECIAL = re.compile(r"""([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])""")
WORD_JOINER = "\u2060"
# In escaped text: `www` before an escaped dot, an escaped colon before escaped slashes, anything before `\@`.
_AUTOLINK = re.compile(r"(?i:www)(?=\\\.)|\\:(?=\\/\\/)|(?=\\@)")



def markdown_text(text: object, limit: int | None = None) -> str:
    """`text` for a Markdown sink: shown exactly as written, never interpreted.

    Backslash escapes stop every construct but GFM's autolink literals (`www.`, `http://`, `a@b.c`), which
    are found in the text after parsing: there a word joiner (U+2060, invisible) goes between `www` and
    the dot, between `:` and `//`, and before `@`, so that no link is made."""
    escaped = _MD_SPECIAL.sub(r"\\\1", printable(text, limit))
    escaped = _AUTOLINK.sub(lambda m: m.group(0) + WORD_JOINER, escaped)
    # White space at the ends as entities: four leading spaces would start a code block, trailing ones vanish.
    body = escaped.strip()
    lead = escaped[:len(escaped) - len(escaped.lstrip())]
    trail = escaped[len(lead) + len(body):]
    return "".join(f"&#{ord(c)};" for c in lead) + body + "".join(f"&#{ord(c)};" for c in trail)


def markdown_code(text: object, limit: int | None = None) -> str:
    """`text` as an inline code span (paths, model references): a fence longer than any run of backticks in
    it, so the text cannot close the span; nothing inside a code span is interpreted."""
    body = printable(text, limit)
    longest = max((len(run) for run in re.findall("`+", body)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {body} {fence}" if body.strip() else "` `"


def markdown_fence(text: str, info: str = "") -> list[str]:
    """`text` as a fenced code block whose fence is longer than any run of backticks in it (so the text cannot
    close it), control characters escaped line by line."""
    body = [printable(line) for line in text.strip().splitlines()]
    longest = max((len(run) for line in body for run in re.findall("`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, *body, fence]


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
        if safe[column].dtype.kind not in "biufcmM":
            safe[column] = safe[column].map(csv_cell)
    safe.columns = [csv_cell(str(c)) for c in safe.columns]
    return safe.to_csv(index=False).encode()

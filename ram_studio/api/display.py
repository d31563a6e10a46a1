"""How the API's results show themselves: in a notebook as HTML (or Markdown), in a terminal as text. Every
name, path and value from a file is data: escaped for HTML and Markdown, control characters made visible."""
from __future__ import annotations

import html
import math
from typing import Any

from merging.common.errors import printable
from merging.common.escaping import markdown_text

MAX_ROWS = 30  # rows of a table shown inline; the full frame is one attribute away


def _cell(value: Any) -> str:
    """One value as display text (numbers rounded, NaN as –)."""
    if isinstance(value, float):
        return "–" if math.isnan(value) else (f"{value:,.4g}" if abs(value) < 1e15 else f"{value:.3e}")
    if isinstance(value, bool) or value is None:
        return "" if value is None else ("yes" if value else "")
    if isinstance(value, int):
        return f"{value:,}"
    return printable(value, 200)


def _rows(frame) -> tuple[list[str], list[list[str]], int]:
    """Column names, display cells of the first MAX_ROWS rows, and how many rows were left out."""
    cols = [printable(c, 80) for c in frame.columns]
    rows = [[_cell(v) for v in row] for row in frame.head(MAX_ROWS).itertuples(index=False)]
    return cols, rows, max(0, len(frame) - MAX_ROWS)


class Shown:
    """A result that shows itself: subclasses give `_title()` (one line), `_facts()` (label → value) and
    `_parts()` (a list of ("table", frame) or ("text", str))."""

    def _title(self) -> str:
        raise NotImplementedError

    def _facts(self) -> dict[str, Any]:
        return {}

    def _parts(self) -> list[tuple[str, Any]]:
        return []

    def _repr_html_(self) -> str:
        out = [f"<div><b>{html.escape(printable(self._title()))}</b>"]
        facts = self._facts()
        if facts:
            out.append("<br>" + " · ".join(f"{html.escape(k)}: {html.escape(_cell(v))}" for k, v in facts.items()))
        for kind, part in self._parts():
            if kind == "text":
                out.append(f"<p>{html.escape(printable(part))}</p>")
                continue
            cols, rows, more = _rows(part)
            head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in rows)
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            if more:
                out.append(f"<small>… and {more} more rows</small>")
        return "\n".join(out) + "</div>"

    def _repr_markdown_(self) -> str:
        out = [f"**{markdown_text(self._title())}**"]
        facts = self._facts()
        if facts:
            out.append(" · ".join(f"{markdown_text(k)}: {markdown_text(_cell(v))}" for k, v in facts.items()))
        for kind, part in self._parts():
            if kind == "text":
                out.append(markdown_text(part))
                continue
            cols, rows, more = _rows(part)
            lines = ["| " + " | ".join(markdown_text(c) for c in cols) + " |", "|" + "---|" * len(cols)]
            lines += ["| " + " | ".join(markdown_text(v) for v in r) + " |" for r in rows]
            out.append("\n".join(lines) + (f"\n\n… and {more} more rows" if more else ""))
        return "\n\n".join(out)

    def __str__(self) -> str:
        lines = [printable(self._title())]
        facts = self._facts()
        if facts:
            lines.append(" · ".join(f"{k}: {_cell(v)}" for k, v in facts.items()))
        for kind, part in self._parts():
            if kind == "text":
                lines.append(printable(part))
            else:
                from ram_studio.console import table

                lines.append(table(part.head(MAX_ROWS)))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {printable(self._title(), 200)}>"

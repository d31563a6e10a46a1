"""Text that comes from files (model and tensor names, paths, config values, messages that quote them) is
data, never markup: the one place that makes it safe for the app's two renderers.

- Streamlit Markdown (`st.markdown`, `st.caption`, `st.error`/`warning`/`info`/`success`, `st.progress`
  text, widget labels and help): `md` for running text, `md_code` for a name or path shown as code. No
  link, image, autolink, HTML, emphasis, directive or math can come out of either.
- plotly (titles, subtitles, axis and legend labels, hover text, annotations: its pseudo-HTML, `%{…}`
  templates and `$…$` math): `plot_text`.

Both first escape control characters and bidi overrides (`merging.escaping.printable`), as the terminal does.
"""
from __future__ import annotations

import re

from merging.escaping import printable

# Every ASCII punctuation character may be backslash-escaped in CommonMark; escaping all of them leaves no
# construct (link, image, autolink, emphasis, HTML, heading, list, table, directive, math) to start.
_MD_SPECIAL = re.compile(r"""([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])""")
WORD_JOINER = "\u2060"
# In escaped text: `www` before an escaped dot, an escaped colon before escaped slashes, anything before `\@`.
_AUTOLINK = re.compile(r"(?i:www)(?=\\\.)|\\:(?=\\/\\/)|(?=\\@)")
_PLOT_SPECIAL = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;", "%": "&#37;",
                 "$": "&#36;"}


def md(text: object, limit: int | None = None) -> str:
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


def md_code(text: object, limit: int | None = None) -> str:
    """`text` as an inline code span (paths, model references): a fence longer than any run of backticks in
    it, so the text cannot close the span; nothing inside a code span is interpreted."""
    body = printable(text, limit)
    longest = max((len(run) for run in re.findall("`+", body)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {body} {fence}" if body.strip() else "` `"


def plot_text(text: object, limit: int | None = None) -> str:
    """`text` for a plotly label, title or hover text: its pseudo-HTML tags, entities, `%{…}` placeholders
    and `$…$` math are shown as written (as entities, which plotly turns back into the characters)."""
    return "".join(_PLOT_SPECIAL.get(c, c) for c in printable(text, limit))

"""Text that comes from files (model and tensor names, paths, config values, messages that quote them) is
data, never markup: the one place that makes it safe for the app's two renderers.

- Streamlit Markdown (`st.markdown`, `st.caption`, `st.error`/`warning`/`info`/`success`, `st.progress`
  text, widget labels and help): `md` for running text, `md_code` for a name or path shown as code. No
  link, image, autolink, HTML, emphasis, directive or math can come out of either.
- plotly (titles, subtitles, axis and legend labels, hover text, annotations: its pseudo-HTML, `%{…}`
  templates and `$…$` math): `plot_text`.

Both first escape control characters and bidi overrides (`merging.common.escaping.printable`), as the terminal does.
"""
from __future__ import annotations

from merging.common.escaping import WORD_JOINER, printable
from merging.common.escaping import markdown_code as md_code
from merging.common.escaping import markdown_text as md

__all__ = ["WORD_JOINER", "md", "md_code", "plot_text"]

_PLOT_SPECIAL = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;", "%": "&#37;",
                 "$": "&#36;"}


def plot_text(text: object, limit: int | None = None) -> str:
    """`text` for a plotly label, title or hover text: its pseudo-HTML tags, entities, `%{…}` placeholders
    and `$…$` math are shown as written (as entities, which plotly turns back into the characters)."""
    return "".join(_PLOT_SPECIAL.get(c, c) for c in printable(text, limit))

"""The app's figures for the Python API: the same plotly builders the Streamlit pages draw (app/charts), titled
and themed the same way. The builders are pure (frames in, figures out); this is the only place the API reaches
into the app package, and only for them (tests/test_architecture.py allows exactly this)."""
from __future__ import annotations

from typing import Any

THEMES = ("light", "dark")


def charts():
    """app.charts, imported without changing plotly's default template in the caller's session."""
    import plotly.io as pio

    before = pio.templates.default
    from app import charts as builders

    pio.templates.default = before
    return builders


def titled(fig, title: str, params: dict[str, Any] | None = None, theme: str = "light"):
    """`fig` with the app's title band, a subtitle naming `params` and the light or dark theme."""
    if theme not in THEMES:
        from merging.common.errors import RamStudioError

        raise RamStudioError(f"theme={theme!r} is not a chart theme.", "Use theme='light' or theme='dark'.")
    c = charts()
    return c.styled(fig, title, c.subtitle_of(params), kind=theme)

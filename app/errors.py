"""Readable error boxes for every page: what went wrong and what to do, never a traceback."""
from __future__ import annotations

import contextlib
from typing import Iterator

import streamlit as st

from app.markup import md
from merging.common.errors import RamStudioError


def show_error(exc: BaseException, what: str = "") -> None:
    """A readable error box: what went wrong and what to do; never a traceback."""
    prefix = f"{what} failed: " if what else ""
    if isinstance(exc, RamStudioError):
        msg = f"**{md(prefix + exc.message)}**"
        if exc.hint:
            msg += f"\n\n{md(exc.hint)}"
    else:
        text = str(exc).splitlines()[0] if str(exc) else ""
        msg = (f"**{md(prefix + 'unexpected ' + type(exc).__name__ + (': ' + text if text else ''), 300)}**\n\n"
               "The rest of the app still works. Check the inputs; if it persists, run the same step "
               "with the `ram-studio` command to see full details.")
    st.error(msg, icon=":material/error:")


@contextlib.contextmanager
def guard(what: str = "") -> Iterator[None]:
    """Run a block; any error becomes an `st.error` and the rest of the page keeps working."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 — every failure is shown, none is raised to the user
        show_error(exc, what)

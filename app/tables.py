"""How tables show text: a column as wide as its longest label (up to a limit), never cut mid-name; long paths
shortened at their start so their end (the folder's own name) stays visible; a table wider than the page scrolls
sideways with a visible scroll bar and its first column pinned; static tables wrap their headers."""
from __future__ import annotations

from functools import partial
from typing import Callable

import pandas as pd
import streamlit as st

from merging.common.escaping import csv_bytes, printable

CHAR_PX, PAD_PX, MAX_PX = 7.5, 28, 520  # a 14 px character in the data grid, the cell's padding, the widest column
PATH_CHARS = 40  # a path in a table or a line of text: its last 40 characters (the folder's own name and more)
ROWS_SHOWN = 12  # a table shows this many rows before it scrolls

# Streamlit hides scroll bars until the pointer is over them (and macOS until one scrolls): a table wider than the
# page then looks complete. Both kinds of table show theirs; static tables wrap headers and text at spaces.
TABLE_CSS = ("[data-testid='stDataFrame'] .dvn-scroller,[data-testid='stTable']>div{scrollbar-width:thin!important;"
             "scrollbar-color:rgba(128,128,128,.7) transparent!important}"
             "[data-testid='stTable'] th,[data-testid='stTable'] td{white-space:normal!important}")


def csv_later(frame: pd.DataFrame) -> Callable[[], bytes]:
    """A download button's data: the frame as CSV (escaped, see csv_bytes), made when the button is clicked, not
    on every draw of the page — most draws download nothing, and a many-tensor analysis's table is large."""
    return partial(csv_bytes, frame)


def path_end(text: object, limit: int = PATH_CHARS) -> str:
    """`text` (escaped) shortened to at most `limit` characters at its start, from a `/` where one leaves the
    last folder's name whole: '…/runs/ReasonFlux-Coder-7B'. The one way the app shortens a path or an id,
    wherever it shows one."""
    s = printable(text)
    if len(s) <= limit:
        return s
    tail = s[len(s) - limit + 1:]
    cut = tail.find("/")  # the earliest separator: the longest tail that starts at one
    return "…" + (tail[cut:] if 0 <= cut < len(tail) - 1 else tail)


def _px(values, header: str) -> int:
    longest = max([len(str(v)) for v in values] + [len(str(header))])
    return int(min(MAX_PX, PAD_PX + CHAR_PX * longest))


def fitted_columns(df: pd.DataFrame, index: bool = False) -> dict:
    """`column_config` giving every text column (and the index when shown) the width its longest value or header
    needs, so labels like 'ram_plus (this session)' are not cut; a number column is as wide as its header (when
    that is long). A table wider than the page scrolls sideways instead of cutting names."""
    config = {c: st.column_config.Column(width=_px(df[c] if not pd.api.types.is_numeric_dtype(df[c]) else [], c))
              for c in df.columns if len(df) and (not pd.api.types.is_numeric_dtype(df[c]) or len(str(c)) > 8)}
    if index and len(df):
        config["_index"] = st.column_config.Column(width=_px(df.index, df.index.name or ""))
    return config


def table_px(df: pd.DataFrame, index: bool = False) -> int:
    """About how wide the table is drawn with `fitted_columns` (px): a number column takes ~10 characters."""
    cols = [_px(df[c] if not pd.api.types.is_numeric_dtype(df[c]) else ["0" * 8], c) for c in df.columns]
    return sum(cols) + (_px(df.index, df.index.name or "") if index else 0)


def show_table(data, *, index: bool = False, key: str | None = None, height: int | str | None = None,
               config: dict | None = None, width_share: float = 1.0) -> None:
    """Every table the app draws (`data`: a DataFrame or its Styler): columns as wide as their content
    (`fitted_columns`, then `config`), all rows up to ROWS_SHOWN without an inner scroll, and, when wider than its
    place, the first column (the row's name) pinned while the rest scrolls sideways behind a visible scroll bar."""
    from app.viewport import content_width

    df = data.data if isinstance(getattr(data, "data", None), pd.DataFrame) else data
    cfg = fitted_columns(df, index=index)
    if table_px(df, index) > content_width() * width_share and len(df.columns):
        first = "_index" if index else df.columns[0]
        base = cfg.get(first) or st.column_config.Column()
        cfg[first] = {**base, "pinned": True}
    for name, extra in (config or {}).items():  # a caller's format or label, keeping the fitted width and pin
        cfg[name] = {**cfg.get(name, {}), **{k: v for k, v in extra.items() if v is not None}}
    rows = min(len(df), ROWS_SHOWN)
    st.dataframe(data, hide_index=not index, width="stretch", key=key, column_config=cfg,
                 height=height or (38 + 35 * rows if len(df) else "auto"))

"""How tables show text: a column as wide as its longest label (up to a limit), never cut mid-name, and long
paths shortened at their start so their end (the folder's own name) stays visible."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from merging.common.escaping import printable

CHAR_PX, PAD_PX, MAX_PX = 7.5, 28, 520  # a 14 px character in the data grid, the cell's padding, the widest column


def path_end(text: object, limit: int = 60) -> str:
    """`text` (escaped) shortened to `limit` characters at its start: '…/runs/ReasonFlux-Coder-7B'."""
    s = printable(text)
    return s if len(s) <= limit else "…" + s[len(s) - limit + 1:]


def fitted_columns(df: pd.DataFrame, index: bool = False) -> dict:
    """`column_config` giving every text column (and the index when shown) the width its longest value or header
    needs, so labels like 'ram_plus (this session)' are not cut; a number column is as wide as its header (when
    that is long). A table wider than the page scrolls sideways instead of cutting names."""
    def px(values, header: str) -> int:
        longest = max([len(str(v)) for v in values] + [len(str(header))])
        return int(min(MAX_PX, PAD_PX + CHAR_PX * longest))

    config = {c: st.column_config.Column(width=px(df[c] if not pd.api.types.is_numeric_dtype(df[c]) else [], c))
              for c in df.columns if len(df) and (not pd.api.types.is_numeric_dtype(df[c]) or len(str(c)) > 8)}
    if index and len(df):
        config["_index"] = st.column_config.Column(width=px(df.index, df.index.name or ""))
    return config

"""The preset picker shared by Tune and Merge: a named setting (merging/presets.py) and, for the RAM authors'
script's modes, its rescale factor R."""
from __future__ import annotations

from typing import Any, Callable

import streamlit as st

from merging.presets import PRESETS, SCRIPT_DEFAULT_R, Preset, get_preset

CUSTOM = "custom"


def picker(key: str, rescale_key: str, on_change: Callable[[], None], custom_label: str, help: str,
           disabled: bool = False, label: str = "Preset") -> str:
    """A preset menu (with `custom` first), R beside it for the authors' modes, and the preset's λ rule in words;
    `on_change` runs when either changes. Returns the chosen name."""
    from app.charts import text_px
    from app.viewport import content_width

    names = [custom_label, *(p.title for p in PRESETS.values())]  # the box as wide as its longest choice
    row = st.container(horizontal=True, vertical_alignment="bottom", wrap=True)
    name = row.selectbox(label, [CUSTOM, *PRESETS], key=key, on_change=on_change, disabled=disabled, help=help,
                         format_func=lambda n: custom_label if n == CUSTOM else PRESETS[n].title,
                         width=int(min(content_width(), 60 + max(text_px(n, 14) for n in names))))
    if name != CUSTOM and PRESETS[name].uses_r:
        if rescale_key not in st.session_state:
            st.session_state[rescale_key] = SCRIPT_DEFAULT_R
        row.number_input("R (rescale factor)", min_value=1.0, max_value=3.0, step=0.05, format="%.2f",
                         key=rescale_key, on_change=on_change, disabled=disabled, width=170,
                         help="The script's --rescale_factor: 1.05 by default, 1.2 in its README; r = R − 1.")
    if name != CUSTOM:
        st.caption(PRESETS[name].summary)
    return name


def chosen(key: str, rescale_key: str) -> tuple[Preset, dict[str, Any]] | None:
    """The preset picked under `key` and its parameters (with the R under `rescale_key`), or None for custom."""
    name = st.session_state.get(key, CUSTOM)
    if name == CUSTOM:
        return None
    preset = get_preset(name)
    return preset, preset.params(st.session_state.get(rescale_key, SCRIPT_DEFAULT_R) if preset.uses_r else None)

"""RAM Studio: `streamlit run app/main.py` — a multipage app that opens on the bundled demo, already loaded."""
from __future__ import annotations

import html
from pathlib import Path

import streamlit as st

from app import charts, state

st.set_page_config(page_title="RAM Studio", page_icon=":material/merge:", layout="wide")

# Page scripts live in app/views/, not app/pages/: a `pages/` folder next to the entry point switches on
# Streamlit's legacy (v1) navigation, which then fights st.navigation in the sidebar.
PAGES = Path(__file__).resolve().parent / "views"
pages = [
    st.Page(PAGES / "models.py", title="Models", icon=":material/inventory_2:"),
    st.Page(PAGES / "heterogeneity.py", title="Heterogeneity", icon=":material/scatter_plot:", default=True),
    st.Page(PAGES / "tune.py", title="Tune", icon=":material/tune:"),
    st.Page(PAGES / "dilution.py", title="Signal dilution", icon=":material/school:"),
    st.Page(PAGES / "merge.py", title="Merge & export", icon=":material/merge:"),
]
nav = st.navigation(pages)
st.html("<style>[data-testid='stMainBlockContainer']{padding-top:2.5rem;padding-bottom:3rem}</style>")

with st.sidebar:
    st.markdown("### RAM Studio")
    st.caption("Reinforced Agent Merging: average what RL agents share, keep what is unique to each.")
    sel = state.selection()
    if sel is None:
        st.caption("No models selected.")
    else:
        st.markdown(f"**Base** `{sel.base}`")
        st.markdown("**Agents**")
        colors = charts.agent_colors(list(sel.agents))  # the same colour as in every chart
        st.html("".join(f"<div style='font-size:0.85rem;margin:2px 0'><span style='display:inline-block;width:10px;"
                        f"height:10px;border-radius:50%;background:{c};margin-right:6px'></span>"
                        f"<code>{html.escape(a)}</code></div>" for a, c in colors.items()))
        if state.cached_analysis(sel) is not None:
            st.caption(":material/check_circle: analysis ready")

try:
    nav.run()
except Exception as exc:  # noqa: BLE001 — last line of defence: a readable box, the other pages still work
    state.show_error(exc, f"The {nav.title} page")

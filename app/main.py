"""RAM Studio: `streamlit run app/main.py` — a multipage app that opens on the bundled demo, already loaded."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run app/main.py` puts app/ first on the path, not the repo
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

try:  # A `pages/` folder next to the entry point makes Streamlit also send its legacy (v1) page list on every
    # run; a run interrupted early (fast slider moves) then leaves that list in the sidebar. We use st.navigation.
    from streamlit.runtime.pages_manager import PagesManager

    PagesManager.uses_pages_directory = False
except (ImportError, AttributeError):  # other Streamlit versions: harmless to skip
    pass

from app import state  # noqa: E402

st.set_page_config(page_title="RAM Studio", page_icon=":material/merge:", layout="wide")

PAGES = Path(__file__).resolve().parent / "pages"
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
        st.markdown("**Agents** " + " ".join(f"`{a}`" for a in sel.agents))
        if state.cached_analysis(sel) is not None:
            st.caption(":material/check_circle: analysis ready")

nav.run()

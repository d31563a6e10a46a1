"""RAM Studio: `streamlit run app/main.py` — a multipage app that opens on the bundled demo, already loaded."""
from __future__ import annotations

import html
from pathlib import Path

import streamlit as st

from merging.common.threads import openmp_waits_passively

openmp_waits_passively()  # the app is a command: set before its modules below load torch and numba

from app import charts, jobs, state  # noqa: E402
from app.markup import md  # noqa: E402
from merging.common.escaping import printable  # noqa: E402

# An emoji favicon is drawn locally (a data: URL); a :material/…: page icon would be fetched from fonts.gstatic.com
# on every page load, a request to a third party the app never needs.
st.set_page_config(page_title="RAM Studio", page_icon="🔀", layout="wide")

# Page scripts live in app/views/, not app/pages/: a `pages/` folder next to the entry point switches on
# Streamlit's legacy (v1) navigation, which then fights st.navigation in the sidebar.
PAGES = Path(__file__).resolve().parent / "views"
pages = [
    st.Page(PAGES / "models.py", title="Models", icon=":material/inventory_2:"),
    st.Page(PAGES / "heterogeneity.py", title="Heterogeneity", icon=":material/scatter_plot:", default=True),
    st.Page(PAGES / "tune.py", title="Tune", icon=":material/tune:"),
    st.Page(PAGES / "dilution.py", title="Signal dilution", icon=":material/school:"),
    st.Page(PAGES / "sweep.py", title="Sweep", icon=":material/query_stats:"),
    st.Page(PAGES / "merge.py", title="Merge & export", icon=":material/merge:"),
]
nav = st.navigation(pages)
st.html("<style>[data-testid='stMainBlockContainer']{padding-top:2.5rem;padding-bottom:3rem}</style>")

def model_line(ref: str, label: str, color: str | None) -> str:
    """One model in the sidebar: a colour dot, its label, and the end of its path or id (full text on hover)."""
    from merging.reading.refs import parse_ref

    try:
        r = parse_ref(ref)
        where = (f"{r.repo_id}{'@' + r.revision if r.revision else ''}" if r.kind == "hub" else ref if r.kind == "demo"
                 else "…/" + "/".join(Path(r.path).parts[-2:]))
    except Exception:  # noqa: BLE001 — an unparsable reference is shown as typed
        where = ref
    dot = (f"<span style='display:inline-block;width:10px;height:10px;border-radius:50%;background:{color};"
           "margin-right:6px'></span>") if color else ""
    sub = "" if where == label else (f"<div style='font-size:0.72rem;opacity:0.65;margin-left:16px;overflow:hidden;"
                                     f"text-overflow:ellipsis;white-space:nowrap'>{html.escape(printable(where))}</div>")
    return (f"<div title='{html.escape(printable(ref), quote=True)}' style='font-size:0.85rem;margin:3px 0'>{dot}"
            f"<code>{html.escape(printable(label))}</code>{sub}</div>")


with st.sidebar:
    st.markdown("### RAM Studio")
    st.caption("Reinforced Agent Merging: average what RL agents share, keep what is unique to each.")
    sel = state.selection()
    # a reload or a shared link opens the same models (and re-attaches to the jobs this session follows)
    state.sync_url(sel, {jobs.URL_JOB: jobs.followed()} if jobs.followed() else None)
    if sel is None:
        st.caption("No models selected.")
    else:
        labels = state.labels(sel)
        colors = charts.agent_colors(labels[1:])  # by name: the same colour as in every chart
        st.markdown("**Base**")
        st.html(model_line(sel.base, labels[0], None))
        st.markdown("**Agents**")
        st.html("".join(model_line(ref, label, colors[label]) for ref, label in zip(sel.agents, labels[1:])))
        if state.cached_analysis(sel) is not None:
            st.caption(":material/check_circle: analysis ready")
    st.radio("Chart downloads (camera button)", list(charts.FIG_FORMATS), key=charts.FIG_FORMAT_KEY,
             help="What a chart's camera button saves: a titled PNG at print scale (3000 px wide) or an SVG, "
                  "named after the chart and its parameters.")

if state.URL_ERROR_KEY in st.session_state:  # the link named models that cannot be opened: said once, here
    message, hint = st.session_state[state.URL_ERROR_KEY]
    st.warning(f"**The models in this link were not opened**: {md(message)} {md(hint)} Showing the bundled demo "
               "instead.", icon=":material/link_off:")

try:
    nav.run()
except Exception as exc:  # noqa: BLE001 — last line of defence: a readable box, the other pages still work
    state.show_error(exc, f"The {nav.title} page")

"""RAM Studio: `streamlit run app/main.py` — a multipage app that opens on the bundled demo, already loaded."""
from __future__ import annotations

import html
from pathlib import Path

import streamlit as st

from merging.common.threads import openmp_waits_passively

openmp_waits_passively()  # the app is a command: set before its modules below load torch and numba

from app import charts, jobs, state, viewport  # noqa: E402
from app.markup import md  # noqa: E402
from app.quiet import quiet_library_bars  # noqa: E402
from app.tables import TABLE_CSS, path_end  # noqa: E402
from merging.common.escaping import printable  # noqa: E402

quiet_library_bars()  # no "Loading weights" bars in the server's terminal: the pages show progress themselves


@st.cache_resource(show_spinner=False)
def _kernels_loading() -> tuple[str, ...]:
    """Once per server: the compiled kernels load in the background while the user picks models, so the first
    analysis or merge does not wait for them (about 1.5 s on 2 cores)."""
    from merging.kernels import preload

    return preload()


_kernels_loading()

# An emoji favicon is drawn locally (a data: URL); a :material/…: page icon would be fetched from fonts.gstatic.com
# on every page load, a request to a third party the app never needs.
st.set_page_config(page_title="RAM Studio", page_icon="🔀", layout="wide")

# Page scripts live in app/views/, not app/pages/: a `pages/` folder next to the entry point switches on
# Streamlit's legacy (v1) navigation, which then fights st.navigation in the sidebar.
PAGES = Path(__file__).resolve().parent / "views"
# Every page has its own address (/heterogeneity?base=…&agent=…: a bookmark or a shared link opens that page on
# those models). The root address opens Heterogeneity by forwarding there: a default page's own address would
# be "/" only, and /heterogeneity would not exist.
pages = [
    st.Page(PAGES / "models.py", title="Models", icon=":material/inventory_2:", url_path="models"),
    st.Page(PAGES / "heterogeneity.py", title="Heterogeneity", icon=":material/scatter_plot:",
            url_path="heterogeneity"),
    st.Page(PAGES / "tune.py", title="Tune", icon=":material/tune:", url_path="tune"),
    st.Page(PAGES / "dilution.py", title="Signal dilution", icon=":material/school:", url_path="dilution"),
    st.Page(PAGES / "sweep.py", title="Sweep", icon=":material/query_stats:", url_path="sweep"),
    st.Page(PAGES / "merge.py", title="Merge & export", icon=":material/merge:", url_path="merge"),
]
LANDING = pages[1]


def _home() -> None:
    """The root address: Heterogeneity, with the link's parameters (models, followed jobs)."""
    st.switch_page(LANDING, query_params={k: st.query_params.get_all(k) for k in st.query_params})


nav = st.navigation([st.Page(_home, title="RAM Studio", default=True, visibility="hidden"), *pages])
st.html("<style>[data-testid='stMainBlockContainer']{padding-top:2.5rem;padding-bottom:3rem}"
        f"{TABLE_CSS}{viewport.CSS}{charts.LIBRARY_CSS}</style>")

def model_line(ref: str, label: str, color: str | None) -> str:
    """One model in the sidebar: a colour dot, its label, and the end of its path or id (full text on hover)."""
    from merging.reading.refs import parse_ref

    try:
        r = parse_ref(ref)
        where = (f"{r.repo_id}{'@' + r.revision if r.revision else ''}" if r.kind == "hub" else ref if r.kind == "demo"
                 else str(r.path))
    except Exception:  # noqa: BLE001 — an unparsable reference is shown as typed
        where = ref
    dot = (f"<span style='display:inline-block;width:10px;height:10px;border-radius:50%;background:{color};"
           "margin-right:6px'></span>") if color else ""
    sub = "" if where == label else (f"<div style='font-size:0.72rem;opacity:0.65;margin-left:16px;"
                                     f"white-space:nowrap'>{html.escape(path_end(where, 32))}</div>")
    return (f"<div title='{html.escape(printable(ref), quote=True)}' style='font-size:0.85rem;margin:3px 0'>{dot}"
            f"<code>{html.escape(printable(label))}</code>{sub}</div>")


def models_panel(slot) -> None:
    """The models in use, in the sidebar: drawn before the page and again after it, so a page that changes them
    ("Use these models", a loaded YAML) or analyses them ("analysis ready") is reflected at once."""
    sel = state.selection()
    with slot.container():
        if sel is None:
            st.caption("No models selected.")
            return
        labels = state.labels(sel)
        colors = charts.agent_colors(labels[1:])  # by name: the same colour as in every chart
        st.markdown("**Base**")
        st.html(model_line(sel.base, labels[0], None))
        st.markdown("**Agents**")
        st.html("".join(model_line(ref, label, colors[label]) for ref, label in zip(sel.agents, labels[1:])))
        if state.cached_analysis(sel) is not None:
            st.caption(":material/check_circle: analysis ready")


with st.sidebar:
    st.markdown("### RAM Studio")
    st.caption("Reinforced Agent Merging: average what RL agents share, keep what is unique to each.")
    sel = state.selection()
    # a reload or a shared link opens the same models (and re-attaches to the jobs this session follows)
    state.sync_url(sel, {jobs.URL_JOB: jobs.followed()} if jobs.followed() else None)
    models = st.empty()
    models_panel(models)
    st.radio("Chart downloads (camera button)", list(charts.FIG_FORMATS), key=charts.FIG_FORMAT_KEY,
             help="What a chart's camera button saves: a titled PNG at print scale (3000 px wide) or an SVG, "
                  "named after the chart and its parameters.")
    viewport.measure()  # the main column's width, for the charts' layout

if state.URL_ERROR_KEY in st.session_state:  # the link named models that cannot be opened: said once, here
    message, hint = st.session_state[state.URL_ERROR_KEY]
    st.warning(f"**The models in this link were not opened**: {md(message)} {md(hint)} Showing the bundled demo "
               "instead.", icon=":material/link_off:")

try:
    nav.run()
except Exception as exc:  # noqa: BLE001 — last line of defence: a readable box, the other pages still work
    state.show_error(exc, f"The {nav.title} page")
models_panel(models)  # after the page: the models it ended with (st.stop and st.rerun end the run before this)

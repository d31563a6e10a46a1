"""A Streamlit page of its own for the browser layout test (`streamlit run tests/browser/chart_gallery.py`): every
chart builder of the app on a real analysis of `?n=` agents named like the paper's (tests/chart_cases.py), drawn
by `charts.show` in the places the app's pages give them (pairs side by side or stacked, λ(ρ) beside its table),
and every table the app shows, by the app's own table code (app/tables.py), with the same sidebar and page style
as app/main.py — so a window width gives each chart and table the width it gets in the app."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from app import charts, viewport  # noqa: E402
from tests.chart_cases import EPS, cases, long_named_result  # noqa: E402

st.set_page_config(page_title="Chart gallery", layout="wide")
st.html(f"<style>{viewport.CSS}</style>")


@st.cache_resource(show_spinner=False)
def analysis(n: int):
    """The analysis of `n` paper-named agents (once per server and n)."""
    return long_named_result(Path(tempfile.mkdtemp(prefix="gallery-")) / "models", n)


n = int(st.query_params.get("n", "3"))
with st.sidebar:
    st.markdown("### Chart gallery")
    st.caption(f"{n} agents named like the paper's, every chart and table of the app.")
    viewport.measure()
res = analysis(n)
agents = list(res.agents)
params = {"eps": EPS, "agents": agents}
st.title(f"Gallery: {n} agents")
st.caption(f"content width {viewport.content_width()} px{' (measured)' if viewport.measured() else ''}")
data = pd.DataFrame({"agent": agents})
items = list(cases(res).items())
i = 0
while i < len(items):
    name, (fig, title, share) = items[i]
    if share == 0.5 and i + 1 < len(items) and items[i + 1][1][2] == 0.5:  # a pair, as Heterogeneity draws them
        places, each = charts.pair()
        for place, (name2, (fig2, title2, _)) in zip(places, items[i:i + 2]):
            with place:
                charts.show(fig2, data, f"The {title2.lower()} of {n} agents.", name2, title=title2, params=params,
                            width=each)
        i += 2
        continue
    if share == 0.6:  # λ(ρ) beside the λ_t table, as Tune draws it
        (left, right), shares = charts.beside([2, 3], [260, charts.PAIR_PX])
        left.dataframe(data, hide_index=True)
        with right:
            charts.show(fig, data, f"The {title.lower()}.", name, title=title, params=params, width=shares[1])
    else:
        charts.show(fig, data, f"The {title.lower()} of {n} agents.", name, title=title, params=params)
    i += 1

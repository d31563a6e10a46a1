"""A Streamlit page of its own for the browser layout test (`streamlit run tests/browser/chart_gallery.py`): every
chart builder of the app on a real analysis of `?n=` agents named like the paper's (tests/chart_cases.py; the
Sweep page's, the toy's and the structure charts on synthetic frames, tests/browser/gallery_cases.py), drawn by
`charts.show` in the places the app's pages give them (pairs side by side or stacked, λ(ρ) beside its table), and
every table the app shows, by the app's own table code (app/frames.py, app/tables.py), with the same sidebar and
page style as app/main.py — so a window width gives each chart and table the width it gets in the app."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from app import charts, frames, viewport  # noqa: E402
from app.tables import TABLE_CSS, show_table  # noqa: E402
from tests.browser.gallery_cases import extra_cases  # noqa: E402
from tests.chart_cases import EPS, cases, long_named_result  # noqa: E402

st.set_page_config(page_title="Chart gallery", layout="wide")
st.html(f"<style>{TABLE_CSS}{viewport.CSS}</style>")


def tables_of(res) -> dict:
    """The analysis tables the pages' table frames are built from."""
    from analysis import agreement, tables

    a = {"eps": EPS, "r": 0.1, "alpha": 2.0, "rule": "clip", "rho_scope": "global"}
    return {"lam": tables.lambda_table(res, EPS, 0.1, 2.0, "clip", "global"),
            "uvc": tables.unique_vs_chance(res, EPS), "pv": tables.precision_view(res, EPS),
            "ag": agreement.agent_agreement(res, EPS),
            "tensor": tables.rho_lambda_by(res, EPS, "tensor", 0.1, 2.0, "clip", "global"),
            "cmp": tables.compare_settings(res, a, {**a, "eps": 1e-3, "r": 0.3})}


def every_table(res) -> None:
    """Every table the pages draw, built by their own frame functions (app/frames.py, app/sweep_results.py)."""
    from analysis import paper
    from app.sweep_results import entries_frame
    from evaluation.sweep import Entry
    from merging.reading.checkpoint import open_checkpoint
    from merging.reading.compat import ModelHeaders, check_compatibility

    t = tables_of(res)
    st.header("Tables")
    show_table(frames.precision_frame(t["pv"], charts.short_labels(list(res.agents))))
    show_table(frames.agreement_frame(t["ag"]))
    show_table(frames.rho_frame(t["lam"], t["uvc"]))
    if any(paper.paper_role(a) for a in res.agents):
        shown, formats = frames.paper_frame(paper.paper_comparison(res))
        show_table(shown, config=formats)
    shown, formats = frames.tensor_frame(t["tensor"])
    show_table(shown, config=formats, height=360)
    st.table(frames.compare_frame(t["cmp"]))
    heads = []
    for ref in res.refs:
        with open_checkpoint(ref, download=False) as ckpt:
            heads.append(ModelHeaders.from_checkpoint(ckpt))
    show_table(frames.models_frame(check_compatibility(heads[0], heads[1:]).models_frame(), list(res.refs)))
    show_table(frames.lambdas_frame(t["lam"][["agent", "shared", "unique", "rho", "lambda"]].to_dict("records")))
    entries = [Entry("candidate", f"ram_plus eps=1e-05 r={r} alpha=2.0 rho_scope=global", split, "ram_plus",
                     scores={"code": 40.0 + r, "tool": 50.0, "memory": 45.5}, average=45.17 + r, merge_s=0.8,
                     eval_s=12.5, average_stderr=1.6, selected=r == 0.2, best=r == 0.2, within_noise=True)
               for r in (0.1, 0.2) for split in ("validation", "test")]
    entries += [Entry("reference", a, "test", scores={"code": 30.0, "tool": 40.0, "memory": 35.0}, average=35.0,
                      average_stderr=1.5) for a in res.agents]
    every = entries_frame(entries)
    show_table(every.style.format(precision=2, subset=[c for c in every.columns if c not in
                                                        ("candidate", "split", "chosen", "≈ best", "note")]))


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
        (left, right), shares = charts.beside([2, 3], [300, charts.PAIR_PX])
        left.table(frames.lambda_rows(tables_of(res)["lam"]))
        with right:
            charts.show(fig, data, f"The {title.lower()}.", name, title=title, params=params, width=shares[1])
    else:
        charts.show(fig, data, f"The {title.lower()} of {n} agents.", name, title=title, params=params)
    i += 1
for name, (fig, title) in extra_cases(agents).items():
    charts.show(fig, data, f"The {title.lower()}.", name, title=title, params=params)
every_table(res)

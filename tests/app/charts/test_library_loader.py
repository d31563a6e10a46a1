"""The chart library's loader (app.charts.load_library): a hidden empty chart drawn while a long pass runs, so the
browser loads plotly during the wait; emptied in the same run once the pass is done, it leaves nothing behind."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest


def loader_page() -> None:
    import streamlit as st

    from app import charts

    slot = charts.load_library()
    st.write("the pass runs here")
    if st.session_state.get("done"):
        slot.empty()


def loaders(at: AppTest) -> list[str]:
    return [c.key for c in at.get("plotly_chart") if c.key and c.key.startswith("plotly_loader-")]


def test_the_loader_is_drawn_during_the_pass_and_gone_after_it():
    at = AppTest.from_function(loader_page).run()
    assert not at.exception
    (key,) = loaders(at)  # drawn while the pass runs …
    assert key.startswith("plotly_loader-chart-")
    at.session_state["done"] = True
    at.run()
    assert not at.exception and loaders(at) == []  # … and emptied in the same run once it is done

"""A sweep whose best candidates tie on validation (45.56 vs 45.56 as the tables show them) says so: which
candidates tie and how many more are within noise, instead of a silent "best overall" star (app/sweep_results.py,
on a SweepResult of real entries with these scores)."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest


def page():
    import streamlit as st

    from app.sweep_results import chosen_row, tie_note
    from evaluation.grid import candidate
    from evaluation.sweep import Entry, SweepResult, SweepSpec

    tie = st.session_state.get("tie", True)
    a, b, c = (candidate("ram_plus", {"r": r}) for r in (0.1, 0.2, 0.05))
    scores = {a: 45.5612, b: 45.5571 if tie else 44.0, c: 45.1}
    entries = [Entry("candidate", f"ram_plus r={x.param_dict['r']}", "validation", "ram_plus", average=v,
                     average_stderr=1.6, candidate=x, best=x == a, selected=x == a, within_noise=True)
               for x, v in scores.items()]
    res = SweepResult(SweepSpec("demo:base", ["demo:code", "demo:tool"], [], None), entries, {"ram_plus": a}, a, {},
                      1.0)
    tie_note(res)
    st.write(chosen_row(res, "ram_plus", a)["validation average"])


def test_a_tie_on_validation_is_said():
    at = AppTest.from_function(page).run()
    assert not at.exception
    text = " ".join(w.value for w in at.warning)
    assert "Tie on validation" in text and "ram_plus r=0.1" in text and "ram_plus r=0.2" in text, text
    assert "45.56" in text and "1 other candidate is within noise" in text, text
    assert "(tie)" in at.markdown[0].value


def test_no_tie_no_note():
    at = AppTest.from_function(page)
    at.session_state["tie"] = False
    at.run()
    assert not at.exception and not at.warning
    assert "(tie)" not in at.markdown[0].value and "★" in at.markdown[0].value

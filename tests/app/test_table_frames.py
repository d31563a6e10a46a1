"""The pages' tables (app/frames.py, app/tables.py): human headers, one precision per column, a path by its end,
columns as wide as their content, and a table wider than its place pinned by its first column (it scrolls
sideways behind a visible scroll bar, checked in chromium by tests/browser/)."""
from __future__ import annotations

import json
import re

import pandas as pd
from streamlit.testing.v1 import AppTest

from app import frames
from app.tables import path_end


def test_models_table_has_human_headers_and_shows_paths_by_their_end(tmp_path):
    from merging.reading.checkpoint import open_checkpoint
    from merging.reading.compat import ModelHeaders, check_compatibility
    from tests.factory import make_agent, make_base

    deep = tmp_path / "checkpoints" / "qwen" / "runs" / "2026-11-24"
    base = make_base(deep / "Qwen2.5-7B-Instruct")
    agents = [make_agent(base, deep / name, 0.2, seed=i) for i, name in
              enumerate(["ReasonFlux-Coder-7B", "Qwen2.5-7B-Instruct-ToolRL-grpo-cold"])]
    heads = []
    for ref in [base, *agents]:
        with open_checkpoint(ref, download=False) as ckpt:
            heads.append(ModelHeaders.from_checkpoint(ckpt))
    shown = frames.models_frame(check_compatibility(heads[0], heads[1:]).models_frame(), [str(base), *map(str, agents)])
    assert list(shown.columns) == frames.MODEL_COLUMNS
    assert not any("_" in c for c in shown.columns)  # no raw tied_embeddings, bytes_on_disk
    assert set(shown["tied embeddings"]) <= {"yes", "no", "?"}
    for source, folder in zip(shown["source"], [base, *agents]):
        assert source.startswith("…") and source.endswith(folder.name) and source == path_end(str(folder))


def test_merge_lambda_table_has_one_precision_per_column():
    lambdas = [{"agent": "code", "shared": 1200, "unique": 300, "rho": 4.0, "lambda": 1.26},
               {"agent": "tool", "shared": 900, "unique": 700, "rho": 1.2857142857, "lambda": 1.169857},
               {"agent": "memory", "shared": 50, "unique": 0, "rho": None, "lambda": 1.2}]
    t = frames.lambdas_frame(lambdas)
    assert list(t.columns) == ["agent", "shared", "unique", "ρ_t", "λ_t"]  # not the raw rho / lambda
    assert list(t["λ_t"]) == ["1.2600", "1.1699", "1.2000"]
    assert list(t["ρ_t"]) == ["4", "1.286", "∞"] and list(t["shared"]) == ["1,200", "900", "50"]


def test_paths_are_shortened_at_their_start():
    long = "/data/checkpoints/qwen/runs/2026-11-24/Qwen2.5-7B-Instruct-ToolRL-grpo-cold"
    assert path_end(long).endswith("/Qwen2.5-7B-Instruct-ToolRL-grpo-cold") and path_end(long).startswith("…")
    assert len(path_end(long)) <= 40 and path_end("models/base") == "models/base"
    assert path_end("/tmp/x/very-long-folder-name-without-any-separator" * 2, 20).startswith("…")  # cut mid-name


def table_page():
    import pandas as pd
    import streamlit as st

    from app.tables import show_table

    wide = st.session_state.get("wide", True)
    n = 14 if wide else 1
    show_table(pd.DataFrame({"agent": ["Qwen2.5-7B-Instruct-ToolRL-grpo-cold", "RL-MemoryAgent-7B"],
                             **{f"chance (tensor × binade) {i}": ["12%", "7.5%"] for i in range(n)}}))


def config_of(at) -> dict:
    proto = at.dataframe[0].proto
    return json.loads(proto.columns) if proto.columns else {}


def test_a_table_wider_than_the_page_pins_its_name_column_and_fits_its_columns():
    at = AppTest.from_function(table_page).run()
    cfg = config_of(at)
    agent = next(v for k, v in cfg.items() if re.search(r"agent", k))
    assert agent.get("pinned") is True
    assert agent["width"] >= 7.5 * len("Qwen2.5-7B-Instruct-ToolRL-grpo-cold")  # the longest name, not cut
    header = next(v for k, v in cfg.items() if "binade" in k)
    assert header["width"] >= 7.5 * len("chance (tensor × binade) 0")  # a header never cut
    narrow = AppTest.from_function(table_page)
    narrow.session_state["wide"] = False
    narrow.run()
    assert not any(v.get("pinned") for v in config_of(narrow).values())  # it fits: nothing to pin


def test_frames_from_an_analysis_have_no_raw_headers(tmp_path):
    from analysis import agreement, tables
    from tests.chart_cases import EPS, long_named_result

    res = long_named_result(tmp_path, 3)
    built = [frames.precision_frame(tables.precision_view(res, EPS), {a: a for a in res.agents}),
             frames.agreement_frame(agreement.agent_agreement(res, EPS)),
             frames.rho_frame(tables.lambda_table(res, EPS, 0.1, 2.0), tables.unique_vs_chance(res, EPS)),
             frames.tensor_frame(tables.rho_lambda_by(res, EPS, "tensor", 0.1, 2.0))[0],
             frames.lambda_rows(tables.lambda_table(res, EPS, 0.1, 2.0))]
    for t in built:
        raw = [c for c in t.columns if re.fullmatch(r"[a-z]+(_[a-z]+)+|rho|lambda|numel", str(c))]
        assert not raw, raw
    assert isinstance(built[0], pd.DataFrame)

"""The whole-model precision views (analysis.tables: unique_vs_chance's per-tensor × binade chance, precision_view's
density at ε = 0, one-step shares and where ε sits) on random fp16 and fp32 models, from the brute-force numpy
definitions of tests/analysis/test_precision.py (its own test covers bf16), on the torch path and, for a ladder in
steps, at K steps."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis.stats import analyze
from analysis.tables import precision_view, unique_vs_chance
from tests.analysis.test_precision import ABS, STEPS, brute
from tests.factory import EDGE_SHAPES, make_edge_family

DTYPES = {"fp16": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.mark.parametrize("unit,ladder", [("abs", ABS), ("steps", STEPS)])
@pytest.mark.parametrize("kind", ["fp16", "fp32", "bf16"])
def test_whole_model_views_equal_brute_force(tmp_path, monkeypatch, kind, unit, ladder):
    monkeypatch.setenv("RAM_STUDIO_KERNELS", "torch")
    base, agents = make_edge_family(tmp_path, DTYPES[kind], 3, seed=11 + len(kind))
    res = analyze(base, agents, ladder=ladder, use_cache=False, unit=unit)
    e = brute(base, agents, ladder, steps=unit == "steps")
    total = sum(int(np.prod(s)) for s in EDGE_SHAPES.values())
    for eps in ladder:
        uvc = unique_vs_chance(res, eps).set_index("agent")
        pv = precision_view(res, eps).set_index("agent")
        for t, agent in enumerate(res.agents):
            rows = [v for (_, a, x), v in e.items() if a == t and x == eps]
            changed = sum(r["changed"] for r in rows)
            assert pv.loc[agent, "density_eps0"] == pytest.approx(sum(r["changed_any"] for r in rows) / total)
            if not changed:
                continue
            assert uvc.loc[agent, "unique_share"] == pytest.approx(sum(r["unique"] for r in rows) / changed)
            assert uvc.loc[agent, "chance_unique_share_binade"] == pytest.approx(
                sum(r["chance_unique_binade"] for r in rows) / changed, rel=1e-12)
            assert pv.loc[agent, "one_step_share"] == pytest.approx(sum(r["one_step"] for r in rows) / changed)
            assert pv.loc[agent, "one_step_energy_share"] == pytest.approx(
                sum(r["sq_one_step"] for r in rows) / sum(r["sq_changed"] for r in rows), rel=1e-9)
        below = sum(v["eps_below_step"] for (_, a, x), v in e.items() if a == 0 and x == eps)
        assert pv["eps_below_step_share"].iloc[0] == pytest.approx(below / total)

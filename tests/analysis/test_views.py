"""Derived views the app draws: ρ and λ per layer / module / tensor, norms and sign
conflicts, the chance level of every unique share, the A | B comparison, and the dilution toy — each
checked against a direct count over whole tensors."""
from __future__ import annotations

import math

import pytest
import torch

from analysis import tables
from analysis.stats import analyze
from analysis.toy import COLS, ROWS, toy_rho_lambda, toy_taus, unique_retention
from merging.engine.tensor_merge import merge_in_memory
from merging.methods import regions
from tests.factory import state

LADDER = (0.0, 1e-6, 1e-5, 1e-3)


@pytest.fixture(scope="module")
def res(family):
    base, agents = family
    return analyze(base, agents, ladder=LADDER, use_cache=False)


def taus_by_tensor(family) -> dict[str, torch.Tensor]:
    base, agents = family
    b = state(base)
    ags = [state(a) for a in agents]
    return {n: torch.stack([a[n].float().reshape(-1) - b[n].float().reshape(-1) for a in ags]) for n in b}


def test_rho_lambda_per_tensor_is_the_direct_count(family, res):
    taus = taus_by_tensor(family)
    t = tables.rho_lambda_by(res, 1e-5, "tensor", 0.1, 2.0, "clip", "tensor")
    assert len(t) == len(res.agents) * len(taus)
    for _, row in t.iterrows():
        i = res.agents.index(row["agent"])
        shared, unique = regions.counts(taus[row["tensor"]], 1e-5)[i].tolist()
        assert (row["shared"], row["unique"]) == (shared, unique)
        assert row["rho"] == regions.rho(shared, unique) or (math.isinf(row["rho"]) and unique == 0)
        expect = regions.lambda_for(shared, unique, 0.1, 2.0, "clip") if unique else 1.0
        assert row["lambda"] == pytest.approx(expect)


def test_rho_by_layer_sums_tensors_and_global_lambda_is_constant(res):
    lay = tables.rho_lambda_by(res, 1e-5, "layer", 0.3, 2.0, "soft", "global")
    glob = tables.lambda_table(res, 1e-5, 0.3, 2.0, "soft", "global").set_index("agent")
    for agent, part in lay.groupby("agent"):
        assert part["lambda"].eq(glob.loc[agent, "lambda"]).all()
        assert part["shared"].sum() == glob.loc[agent, "shared"] and part["unique"].sum() == glob.loc[agent, "unique"]
        for _, row in part.iterrows():
            assert row["rho"] == pytest.approx(regions.rho(int(row["shared"]), int(row["unique"])))
    mods = tables.rho_lambda_by(res, 1e-5, "module", 0.3, 2.0, "clip", "tensor")
    assert set(mods["module"]) >= {"q", "k", "v", "gate", "embeddings"}
    assert (mods["lambda"] >= 1).all() and (mods["lambda"] <= 1 + 0.3 * 2.0 + 1e-12).all()
    with pytest.raises(KeyError):
        tables.rho_lambda_by(res, 1e-5, "row", 0.1, 2.0)


def test_tensor_scope_table_shows_the_tensor_rho(res):
    """With tensor scope the λ table showed the whole-model ρ only; now also the per-tensor ρ
    (min, unique-weighted median, max over the tensors that hold unique elements)."""
    tl = tables.lambda_table(res, 1e-5, 0.1, 2.0, "clip", "tensor").set_index("agent")
    per = tables.rho_table(res, 1e-5, "tensor")
    for agent, part in per.groupby("agent"):
        held = part[part["unique"] > 0]
        assert tl.loc[agent, "rho_tensor_min"] == pytest.approx(held["rho"].min())
        assert tl.loc[agent, "rho_tensor_max"] == pytest.approx(held["rho"].max())
        assert held["rho"].min() <= tl.loc[agent, "rho_tensor_median"] <= held["rho"].max()
        srt = held.sort_values("rho")
        half = srt["unique"].cumsum() >= srt["unique"].sum() / 2
        assert tl.loc[agent, "rho_tensor_median"] == pytest.approx(srt["rho"][half].iloc[0])


def test_norms_and_conflicts_match_the_frame(family, res):
    taus = taus_by_tensor(family)
    nc = tables.norms_and_conflicts(res, 1e-5).set_index("agent")
    for i, agent in enumerate(res.agents):
        sq_u = sq_s = 0.0
        conflicts = shared_n = 0
        for t in taus.values():
            m = t.abs() > regions.f32(1e-5)
            c = m.sum(0)
            uniq, shared = m[i] & (c == 1), m[i] & (c >= 2)
            sq_u += float(t[i][uniq].double().pow(2).sum())
            sq_s += float(t[i][shared].double().pow(2).sum())
            pos, neg = (m & (t > 0)).sum(0), (m & (t < 0)).sum(0)
            conflicts += int((shared & torch.where(t[i] > 0, neg > 0, pos > 0)).sum())
            shared_n += int(shared.sum())
        row = nc.loc[agent]
        assert row["norm_unique"] == pytest.approx(math.sqrt(sq_u), rel=1e-9)
        assert row["norm_shared"] == pytest.approx(math.sqrt(sq_s), rel=1e-9)
        assert row["unique_energy_share"] == pytest.approx(sq_u / (sq_u + sq_s), rel=1e-9)
        assert row["sign_conflicts"] == conflicts and row["conflict_share"] == pytest.approx(conflicts / shared_n)


def test_every_unique_share_has_its_chance_level(res):
    """The unique share independent masks of the same densities would give, Π_{j≠i}(1 − d_j),
    beside every unique share: per agent, per layer and per group."""
    g = tables.unique_vs_chance(res, 1e-5).set_index("agent")
    d = g["density"]
    for agent in res.agents:
        expect = math.prod(1 - d[o] for o in res.agents if o != agent)
        assert g.loc[agent, "chance_unique_share"] == pytest.approx(expect)
    lay = tables.unique_shared_by_layer(res, 1e-5)
    for _layer, part in lay.groupby("layer"):
        dens = dict(zip(part["agent"], part["changed"] / part["numel"]))
        for _, row in part.iterrows():
            assert row["chance_unique_share"] == pytest.approx(
                math.prod(1 - dens[o] for o in dens if o != row["agent"]))
    mods = tables.rho_lambda_by(res, 1e-5, "module", 0.1, 2.0)
    assert mods["chance_unique_share"].between(0, 1).all() and "unique_share" in mods


def test_compare_settings(res):
    a = {"eps": 1e-5, "r": 0.1, "alpha": 2.0, "rule": "clip", "rho_scope": "global"}
    b = {"eps": 1e-3, "r": 0.5, "alpha": 2.0, "rule": "soft", "rho_scope": "tensor"}
    cmp = tables.compare_settings(res, a, b).set_index("agent")
    la = tables.lambda_table(res, 1e-5, 0.1, 2.0, "clip", "global").set_index("agent")
    lb = tables.lambda_table(res, 1e-3, 0.5, 2.0, "soft", "tensor").set_index("agent")
    na = tables.norms_and_conflicts(res, 1e-5).set_index("agent")
    nb = tables.norms_and_conflicts(res, 1e-3).set_index("agent")
    for agent in res.agents:
        assert cmp.loc[agent, "lambda_A"] == pytest.approx(la.loc[agent, "lambda"])
        assert cmp.loc[agent, "lambda_B"] == pytest.approx(lb.loc[agent, "lambda"])
        assert cmp.loc[agent, "kept_A"] == pytest.approx(la.loc[agent, "lambda"] * na.loc[agent, "norm_unique"])
        assert cmp.loc[agent, "kept_B"] == pytest.approx(lb.loc[agent, "lambda"] * nb.loc[agent, "norm_unique"])
        assert cmp.loc[agent, "unique_B"] == lb.loc[agent, "unique"]
    same = tables.compare_settings(res, a, dict(a))
    assert same["lambda_change"].eq(0).all() and same["kept_change"].eq(0).all()


def test_toy_rho_lambda_and_retention():
    taus = toy_taus([0.1, 0.3, 0.5], [0.6, 0.4, 0.3], seed=3)
    assert taus.shape == (3, ROWS * COLS)
    t = toy_rho_lambda(taus, ["A1", "A2", "A3"], 0.1, 2.0).set_index("agent")
    counts = regions.counts(taus, 1e-6).tolist()
    for (shared, unique), name in zip(counts, ["A1", "A2", "A3"]):
        assert (t.loc[name, "shared"], t.loc[name, "unique"]) == (shared, unique)
        assert t.loc[name, "lambda"] == pytest.approx(regions.lambda_for(shared, unique, 0.1, 2.0))
    merged = {"average": merge_in_memory("average", taus), "RAM": merge_in_memory("ram", taus, {"eps": 1e-6})}
    ret = unique_retention(taus, merged, ["A1", "A2", "A3"])
    assert ret[ret["method"] == "average"]["retention"].round(6).eq(round(1 / 3, 6)).all()
    assert ret[ret["method"] == "RAM"]["retention"].round(6).eq(1).all()

"""Statistics per group of tensors (models of very many tensors) against statistics per tensor, on sets where both
can be computed: every group row is the sum of its tensors' rows, every view shows the same numbers, tensor-scope
ρ and λ still come from each tensor's own counts, and the columnar cache entry gives the result back. Also the
batched path of many small tensors at a small scale (a MoE-shaped set, and 300 tiny tensors)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import agreement, experts, stats, tables
from analysis.units import GROUP_COLUMNS
from tests.benchmarks.many_tensors import make_models
from tests.benchmarks.moe_shaped import make_moe

LADDER = (0.0, 1e-6, 1e-5, 1e-4)
KEYS = ["agent", *GROUP_COLUMNS, "eps"]
_SETS: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _kernels_ready():
    from merging.kernels import kernels_enabled, wait_ready

    if kernels_enabled():
        assert wait_ready(("tensor_stats", "overlap_histogram"), ("bf16", "f32"), timeout=1800)


def model_set(kind: str, tmp_path_factory) -> list[Path]:
    if kind not in _SETS:
        root = tmp_path_factory.mktemp(kind)
        _SETS[kind] = (make_moe(root, 3, 6, 16, 8) if kind == "moe"
                       else make_models(root, 2000 if kind == "many" else 300, 7))
    return _SETS[kind]


def both(folders: list[Path], monkeypatch, **kw) -> tuple[stats.AnalysisResult, stats.AnalysisResult]:
    """The set analysed with a row per tensor, and with a row per group."""
    out = []
    for many in (10**9, 0):
        monkeypatch.setattr(stats, "MANY_TENSORS", many)
        out.append(stats.analyze(str(folders[0]), [str(f) for f in folders[1:]], ladder=LADDER, use_cache=False, **kw))
    assert not out[0].grouped and out[1].grouped
    return out[0], out[1]


def summed(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per-tensor rows summed per group (norms as square roots of summed squares)."""
    norms = [c for c in ("norm_unique", "norm_shared") if c in frame]
    f = frame.assign(**{c: frame[c] ** 2 for c in norms})
    num = [c for c in f.columns if c not in keys and c != "tensor" and f[c].dtype.kind in "if"]
    g = f.groupby(keys, sort=False)[num].sum().reset_index()
    return g.assign(**{c: g[c] ** 0.5 for c in norms})


def assert_same(a: pd.DataFrame, b: pd.DataFrame, keys: list[str]) -> None:
    a, b = a.sort_values(keys).reset_index(drop=True), b.sort_values(keys).reset_index(drop=True)
    assert len(a) == len(b) and (a[keys].astype(str).to_numpy() == b[keys].astype(str).to_numpy()).all()
    for c in a.columns:
        if c in keys or a[c].dtype.kind not in "if":
            continue
        if a[c].dtype.kind == "i" and b[c].dtype.kind == "i":
            assert a[c].tolist() == b[c].tolist(), c
        else:
            assert np.allclose(a[c], b[c], rtol=1e-12, atol=1e-300, equal_nan=True), c


@pytest.mark.parametrize("kind", ["moe", "many"])
def test_group_rows_are_the_sums_of_their_tensors(kind, tmp_path_factory, monkeypatch):
    """Every column of every group row (agents and pairs) equals its tensors' rows summed; `tensors` counts them."""
    per_tensor, grouped = both(model_set(kind, tmp_path_factory), monkeypatch)
    assert len(grouped.frame) < len(per_tensor.frame) and grouped.total_params == per_tensor.total_params
    g = grouped.frame.drop(columns=["tensor"])
    assert_same(summed(per_tensor.frame, KEYS), g, KEYS)
    pair_keys = ["a", "b", *GROUP_COLUMNS, "eps"]
    assert_same(summed(per_tensor.pairs, pair_keys), grouped.pairs.drop(columns=["tensor"]), pair_keys)
    c = grouped.tensor_counts  # each tensor's own counts, as the per-tensor rows have them
    rows = per_tensor.frame.set_index(["tensor", "agent", "eps"])
    for i in (0, len(c.names) // 2, len(c.names) - 1):
        for t, agent in enumerate(grouped.agents):
            for j, eps in enumerate(LADDER):
                r = rows.loc[(c.names[i], agent, eps)]
                assert (c.shared[i, t, j], c.unique[i, t, j]) == (r["shared"], r["unique"])


def views(result: stats.AnalysisResult) -> dict[str, pd.DataFrame]:
    """The tables the app and the CLI show from a result, with the labels that differ by design dropped."""
    eps = 1e-5
    out = {"density": tables.global_density(result, eps), "chance": tables.unique_vs_chance(result, eps),
           "precision": tables.precision_view(result, eps), "overlap": tables.overlap_distribution(result, eps),
           "norms": tables.norms_and_conflicts(result, eps), "eps": tables.eps_sensitivity(result),
           "layer module": tables.density_by_layer_module(result, eps),
           "by layer": tables.unique_shared_by_layer(result, eps),
           "pairs": agreement.pair_agreement(result, eps),
           "pairs by module": agreement.agreement_by(result, eps, "module"),
           "agents": agreement.agent_agreement(result, eps),
           "lambda tensor": tables.lambda_table(result, eps, 0.1, 0.2, "clip", "tensor"),
           "lambda global": tables.lambda_table(result, eps, 0.1, 0.2, "clip", "global"),
           "rho tensor": tables.rho_table(result, eps, "tensor")}
    for by in ("layer", "module", "layer × module"):
        for scope in ("global", "tensor"):
            out[f"rho {by} {scope}"] = tables.rho_lambda_by(result, eps, by, 0.1, 0.2, "clip", scope)
    if experts.has_experts(result):
        out["experts"] = experts.expert_density(result, eps)
        out["owners"] = experts.expert_owners(result, eps)
    return out


@pytest.mark.parametrize("kind", ["moe", "many"])
def test_every_view_shows_the_same_numbers(kind, tmp_path_factory, monkeypatch):
    """Densities, chance levels (whole model, per tensor, per binade), precision shares, the agreement diagnostics,
    per-layer and per-module tables, expert tables and tensor-scope λ (with its ρ spread): equal either way; so are
    the CLI's JSON records and the reading."""
    per_tensor, grouped = both(model_set(kind, tmp_path_factory), monkeypatch)
    a, b = views(per_tensor), views(grouped)
    for name, frame in a.items():
        other = b[name]
        assert list(frame.columns) == list(other.columns), name
        for c in frame.columns:
            x, y = frame[c].to_numpy(), other[c].to_numpy()
            if frame[c].dtype.kind in "if" and other[c].dtype.kind in "if":
                assert np.allclose(x, y, rtol=1e-9, atol=1e-12, equal_nan=True), (name, c)
            else:
                assert [str(v) for v in x] == [str(v) for v in y], (name, c)
    ja = [{k: v for k, v in r.items()} for r in agreement.pairs_json(per_tensor)]
    jb = agreement.pairs_json(grouped)
    assert [r["both_changed"] for r in ja] == [r["both_changed"] for r in jb]
    assert np.allclose([r["expected_both_tensor"] for r in ja], [r["expected_both_tensor"] for r in jb], rtol=1e-9)
    assert agreement.reading(per_tensor, 1e-5).regime == agreement.reading(grouped, 1e-5).regime
    assert per_tensor.counts_at(1e-5) == grouped.counts_at(1e-5)


def test_a_grouped_result_comes_back_from_the_cache(tmp_path_factory, monkeypatch):
    """The columnar cache entry of a grouped analysis gives back the same frames and per-tensor counts, and agents
    given in another order reorder the counts with the rows."""
    folders = model_set("moe", tmp_path_factory)
    monkeypatch.setattr(stats, "MANY_TENSORS", 0)
    refs = [str(f) for f in folders]
    first = stats.analyze(refs[0], refs[1:], ladder=LADDER)
    again = stats.analyze(refs[0], refs[1:], ladder=LADDER)
    assert not first.from_cache and again.from_cache and again.grouped
    assert again.frame.equals(first.frame) and again.pairs.equals(first.pairs)
    for f in ("shared", "unique", "unit"):
        assert (getattr(again.tensor_counts, f) == getattr(first.tensor_counts, f)).all()
    assert again.tensor_counts.names == first.tensor_counts.names
    swapped = first.reordered([refs[0], refs[2], refs[1], refs[3]])
    assert swapped.agents == [first.agents[1], first.agents[0], first.agents[2]]
    assert (swapped.tensor_counts.shared[:, 0] == first.tensor_counts.shared[:, 1]).all()
    assert tables.lambda_table(swapped, 1e-5, 0.1, 0.2, "clip", "tensor").set_index("agent").loc[first.agents] \
        .equals(tables.lambda_table(first, 1e-5, 0.1, 0.2, "clip", "tensor").set_index("agent"))


def test_the_batched_path_equals_the_per_tensor_path(tmp_path_factory, monkeypatch):
    """300 tiny tensors through the batch kernel (in batches of at most 64 tensors) and through the torch path (one
    tensor at a time): the same counts, the same sums up to the order of additions."""
    from analysis import scan
    from merging.kernels import kernels_enabled
    from merging.reading import batches

    folders = model_set("few", tmp_path_factory)
    refs = [str(f) for f in folders]
    monkeypatch.setattr(batches, "BATCH_TENSORS", 64)
    batched = []
    real = scan.batches_for
    monkeypatch.setattr(scan, "batches_for", lambda *a: batched.append(real(*a)) or batched[-1])
    kernels = kernels_enabled()
    out = []
    for path in ("numba", "torch"):
        monkeypatch.setenv("RAM_STUDIO_KERNELS", path)
        out.append(stats.analyze(refs[0], refs[1:], ladder=LADDER, use_cache=False))
    if kernels:
        assert len(batched[0][0]) == 5 and batched[0][1] == []  # 300 tensors in 5 batches, none left over
    assert batched[1][0] == []  # the torch path: one tensor at a time
    for name in ("frame", "pairs"):
        a, b = getattr(out[0], name), getattr(out[1], name)
        assert list(a.columns) == list(b.columns)
        for c in a.columns:
            if a[c].dtype.kind == "i":
                assert a[c].tolist() == b[c].tolist(), c
            elif a[c].dtype.kind == "f":
                assert np.allclose(a[c], b[c], rtol=1e-9, atol=1e-15), c
            else:
                assert a[c].astype(str).tolist() == b[c].astype(str).tolist(), c

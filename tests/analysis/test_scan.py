"""The analysis pass against a brute-force count over whole tensors, name parsing, and derived views."""
from __future__ import annotations

import math

import pytest
import torch

from analysis import tables
from analysis.ladder import joint_fits
from analysis.names import layer_of, module_of
from analysis.stats import analyze
from merging.methods.regions import lambda_for
from tests.factory import state

LADDER = (0.0, 1e-6, 1e-5, 1e-3)


def brute(base_dir, agent_dirs, eps):
    b = state(base_dir)
    ags = [state(a) for a in agent_dirs]
    out = {}
    for name in b:
        taus = torch.stack([a[name].float().reshape(-1) - b[name].float().reshape(-1) for a in ags])
        m = taus.abs() > eps
        c = m.sum(0)
        pos = (m & (taus > 0)).sum(0)
        neg = (m & (taus < 0)).sum(0)
        for t in range(len(ags)):
            uniq, shared = m[t] & (c == 1), m[t] & (c >= 2)
            opposite = torch.where(taus[t] > 0, neg > 0, pos > 0)
            out[(t, name)] = {
                "changed": int(m[t].sum()), "unique": int(uniq.sum()), "shared": int(shared.sum()),
                "hist": [int((m[t] & (c == k)).sum()) for k in range(1, len(ags) + 1)],
                "norm_unique": float(taus[t][uniq].double().norm()),
                "norm_shared": float(taus[t][shared].double().norm()),
                "conflicts": int((shared & opposite).sum()),
            }
    return out


LONG_LADDER = tuple(sorted({0.0, *(m * 10.0 ** e for e in range(-9, -2) for m in (1, 2, 5))}))  # 22 values


@pytest.mark.parametrize("ladder", [LADDER, LONG_LADDER])
@pytest.mark.parametrize("kernels", ["numba", "torch"])
def test_streaming_stats_equal_brute_force(family, monkeypatch, kernels, ladder):
    """Both the joint-state histogram (short ladder) and the per-ε loop (a ladder whose joint tables would
    exceed their bound) against a brute-force count."""
    assert joint_fits(len(family[1]), len(LADDER)) and not joint_fits(len(family[1]), len(LONG_LADDER))
    monkeypatch.setenv("RAM_STUDIO_KERNELS", kernels)
    base, agents = family
    result = analyze(base, agents, ladder=ladder, chunk_elems=333, use_cache=False)
    for eps in (ladder if ladder is LADDER else ladder[::3]):
        expect = brute(base, agents, eps)
        rows = result.frame[result.frame["eps"] == eps]
        for _, row in rows.iterrows():
            t = result.agents.index(row["agent"])
            e = expect[(t, row["tensor"])]
            assert [row["changed"], row["unique"], row["shared"], row["sign_conflicts"]] == \
                [e["changed"], e["unique"], e["shared"], e["conflicts"]]
            assert [row[f"k{k}"] for k in range(1, 4)] == e["hist"]
            assert row["norm_unique"] == pytest.approx(e["norm_unique"], rel=1e-9, abs=1e-12)
            assert row["norm_shared"] == pytest.approx(e["norm_shared"], rel=1e-9, abs=1e-12)


def test_views_are_consistent(family):
    base, agents = family
    res = analyze(base, agents, ladder=LADDER)
    d = tables.global_density(res, 1e-5)
    assert (d["changed"] == d["shared"] + d["unique"]).all()
    assert d["density"].between(0, 1).all() and res.total_params == sum(t.numel() for t in state(base).values())
    ov = tables.overlap_distribution(res, 1e-5)
    assert ov.groupby("agent")["fraction"].sum().round(9).eq(1).all()
    assert (ov[ov["k"] == 1].set_index("agent")["count"] == d.set_index("agent")["unique"]).all()
    eps_curve = tables.eps_sensitivity(res)
    for _agent, g in eps_curve.groupby("agent"):
        assert g.sort_values("eps")["density"].is_monotonic_decreasing
    lam = tables.lambda_table(res, 1e-5, r=0.1, alpha=2.0)
    for _, row in lam.iterrows():
        assert row["lambda"] == pytest.approx(lambda_for(row["shared"], row["unique"], 0.1, 2.0))
    assert res.counts_at(1e-5) == {"shared": d["shared"].tolist(), "unique": d["unique"].tolist()}
    tl = tables.lambda_table(res, 1e-5, r=0.1, alpha=2.0, scope="tensor")
    assert (tl["lambda_min"] <= tl["lambda"] + 1e-12).all() and (tl["lambda"] <= tl["lambda_max"] + 1e-12).all()
    ret = tables.signal_retention(res, 1e-5, 0.1, 2.0)
    avg = ret[ret["method"] == "average"]["retention"]
    assert avg.eq(1 / 3).all() and ret[ret["method"] == "RAM"]["retention"].eq(1).all()
    layer = tables.density_by_layer_module(res, 1e-5)
    assert set(layer["module"]) >= {"q", "k", "v", "o", "gate", "up", "down", "norm", "embeddings", "lm_head"}
    assert math.isclose(layer["changed"].sum(), d["changed"].sum())


@pytest.mark.parametrize("name,layer,module", [
    ("model.layers.3.self_attn.q_proj.weight", 3, "q"),
    ("model.layers.3.self_attn.k_proj.bias", 3, "k"),
    ("model.layers.12.self_attn.v_proj.weight", 12, "v"),
    ("model.layers.0.self_attn.o_proj.weight", 0, "o"),
    ("model.layers.7.mlp.gate_proj.weight", 7, "gate"),
    ("model.layers.7.mlp.up_proj.weight", 7, "up"),
    ("model.layers.7.mlp.down_proj.weight", 7, "down"),
    ("model.layers.1.input_layernorm.weight", 1, "norm"),
    ("model.layers.1.post_attention_layernorm.weight", 1, "norm"),
    ("model.layers.1.pre_feedforward_layernorm.weight", 1, "norm"),  # Gemma 2
    ("model.layers.1.self_attn.q_norm.weight", 1, "norm"),  # Qwen3 / Gemma 3
    ("model.norm.weight", -1, "norm"),
    ("model.embed_tokens.weight", -1, "embeddings"),
    ("lm_head.weight", -1, "lm_head"),
    ("model.rotary_emb.inv_freq", -1, "other"),
    ("transformer.h.4.mystery.weight", 4, "other"),
])
def test_name_parsing(name, layer, module):
    assert (layer_of(name), module_of(name)) == (layer, module)


@pytest.mark.parametrize("label,role", [("demo:code", "code"), ("Gen-Verse/ReasonFlux-Coder-7B", "code"),
                                        ("agentica-org/DeepCoder-14B", "code"), ("./agents/code/", "code"),
                                        ("chengq9/ToolRL-Llama3.2-3B", "tool"),
                                        ("BytedTsinghua-SIA/RL-MemoryAgent-7B", "memory"),
                                        ("./agents/math", None), ("org/t5-decoder", None),
                                        ("org/unicode-encoder", None)])
def test_paper_role(label, role):
    from analysis.paper import paper_role
    assert paper_role(label) == role


def test_paper_comparison_on_bundled_demo():
    """Cross-checked against a brute-force count over whole tensors (`brute` above, a separate code path)."""
    from analysis.paper import PAPER_AGENTS, paper_comparison
    from merging.reading.refs import resolve
    res = analyze("demo:base", ["demo:code", "demo:tool", "demo:memory"], ladder=(1e-5,))
    cmp = paper_comparison(res).set_index("paper_agent")
    assert list(cmp.index) == ["code", "tool", "memory"]
    base = resolve("demo:base")
    ref = brute(base, [resolve(f"demo:{role}") for role in cmp.index], 1e-5)
    total = sum(t.numel() for t in state(base).values())
    for t, (role, row) in enumerate(cmp.iterrows()):
        changed = sum(v["changed"] for (agent, _), v in ref.items() if agent == t)
        unique = sum(v["unique"] for (agent, _), v in ref.items() if agent == t)
        assert row["paper_density"] == PAPER_AGENTS[role]["density"]
        assert row["paper_unique_share"] == PAPER_AGENTS[role]["unique"]
        assert row["density"] == pytest.approx(changed / total, abs=1e-12)
        assert row["unique_share"] == pytest.approx(unique / changed, abs=1e-12)

"""The structure model on tiny real checkpoints of every family, in both layouts users bring: towers, layers,
module kinds, experts and MoE roles — and names no rule knows listed, never grouped with a known kind."""
from __future__ import annotations

from collections import Counter

import pytest

from merging.reading.checkpoint import open_folder
from merging.reading.structure import (
    FUSED,
    MODULE_ORDER,
    in_module_order,
    place_of,
    structure_of,
)
from tests.families import FAMILIES, LAYOUTS

TEXT = [f for f, s in FAMILIES.items() if s.kind == "text"]
MOE = [f for f, s in FAMILIES.items() if s.kind == "moe"]
VL = [f for f, s in FAMILIES.items() if s.kind == "vl"]
ATTENTION = {"q", "k", "v", "o"}


def places(families, family: str, layout: str):
    names = sorted(open_folder(families.base(family, layout)).tensors)
    s = structure_of(names)
    return s, [(n, s.place(i)) for i, n in enumerate(s.names)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_tensor_of_every_family_is_recognised(families, family, layout):
    s, rows = places(families, family, layout)
    assert s.unknown == []
    towers = {p.tower for _, p in rows}
    assert towers == ({"language", "vision"} if family in VL else {"language"})
    lang = [p for _, p in rows if p.tower == "language"]
    assert {p.layer for p in lang} == {-1, 0, 1}
    assert {p.module for p in lang if p.layer == -1} == {"embeddings", "norm", "lm_head"}
    for layer in (0, 1):
        kinds = {p.module for p in lang if p.layer == layer}
        attention = {"q", "kv", "o"} if family == "deepseek_v3" else ATTENTION  # MLA: q_a/q_b and kv_a/kv_b
        assert attention <= kinds and "norm" in kinds, (layer, kinds)


@pytest.mark.parametrize("family", VL)
def test_vision_blocks_are_not_language_layers(families, family):
    for layout in LAYOUTS:
        s, rows = places(families, family, layout)
        vision = [(n, p) for n, p in rows if p.tower == "vision"]
        assert vision and all("visual" in n or "vision_tower" in n or "multi_modal_projector" in n for n, _ in vision)
        assert {p.layer for _, p in vision} == {-1, 0, 1}  # its own two blocks, beside the language layers
        assert "projector" in {p.module for _, p in vision}
        language = [n for n, p in rows if p.tower == "language"]
        assert not any("visual" in n or "vision_tower" in n for n in language)
        # the same weights, whatever the layout's names: one multiset of places
    saved = Counter(p for _, p in places(families, family, "saved")[1])
    dumped = Counter(p for _, p in places(families, family, "state_dict")[1])
    assert saved == dumped


@pytest.mark.parametrize("family", MOE)
def test_experts_routers_and_shared_experts(families, family):
    moe_layers = {1} if family == "deepseek_v3" else {0, 1}  # DeepSeek's first layer is dense
    saved = places(families, family, "saved")[1]
    dumped = places(families, family, "state_dict")[1]
    for rows, per_expert in ((saved, True), (dumped, False)):
        experts = [p for _, p in rows if p.role == "expert"]
        assert {p.layer for p in experts} == moe_layers
        if per_expert:
            assert Counter((p.layer, p.expert) for p in experts) == \
                {(n, str(e)): 3 for n in moe_layers for e in range(4)}
            assert {p.module for p in experts} == {"gate", "up", "down"}
        else:
            assert {(p.layer, p.expert, p.module) for p in experts} == \
                {(n, FUSED, m) for n in moe_layers for m in ("gate_up", "down")}
        routers = [p for _, p in rows if p.role == "router"]
        assert {p.layer for p in routers} == moe_layers and {p.module for p in routers} == {"router"}
        shared = [p for _, p in rows if p.role == "shared_expert"]
        if family in ("qwen2_moe", "deepseek_v3"):
            assert {(p.layer, p.module) for p in shared} == \
                {(n, m) for n in moe_layers for m in ("gate", "up", "down")}
        else:
            assert shared == []
        dense = [p for _, p in rows if p.role == "" and p.module in ("gate", "up", "down")]
        assert {p.layer for p in dense} == ({0} if family == "deepseek_v3" else set())
    if family == "qwen2_moe":  # two routers per layer: the experts' and the shared expert's gate
        assert Counter(p.layer for _, p in saved if p.role == "router") == {0: 2, 1: 2}


@pytest.mark.parametrize("name,place", [
    ("model.layers.3.mlp.experts.17.gate_proj.weight", ("language", 3, "gate", "17", "expert")),
    ("model.layers.3.block_sparse_moe.experts.2.w3.weight", ("language", 3, "up", "2", "expert")),
    ("model.language_model.layers.5.mlp.experts.gate_up_proj", ("language", 5, "gate_up", FUSED, "expert")),
    ("model.layers.2.mlp.shared_experts.down_proj.weight", ("language", 2, "down", "", "shared_expert")),
    ("model.layers.2.mlp.gate.e_score_correction_bias", ("language", 2, "router", "", "router")),
    ("model.layers.0.mlp.shared_expert_gate.weight", ("language", 0, "router", "", "router")),
    ("model.layers.4.feed_forward.router.weight", ("language", 4, "router", "", "router")),
    ("model.layers.1.self_attn.kv_a_proj_with_mqa.weight", ("language", 1, "kv", "", "")),
    ("transformer.h.4.attn.c_attn.weight", ("language", 4, "qkv", "", "")),
    ("transformer.ln_f.weight", ("language", -1, "norm", "", "")),
    ("model.layers.1.mlp.gate_up_proj.weight", ("language", 1, "gate_up", "", "")),  # Phi-3's dense fused MLP
    ("model.layers.7.mlp.down_proj.weight", ("language", 7, "down", "", "")),
])
def test_names_of_other_layouts(name, place):
    p = place_of(name)
    assert (p.tower, p.layer, p.module, p.expert, p.role) == place


def test_unknown_names_are_listed_not_grouped():
    s = structure_of(["model.embed_tokens.weight", "model.layers.0.mystery.weight", "visual.blocks.2.odd_thing",
                      "visual.blocks.2.attn.qkv.weight", "something_else.weight"])
    assert s.unknown == ["model.layers.0.mystery.weight", "visual.blocks.2.odd_thing", "something_else.weight"]
    assert [s.place(i).tower for i in range(5)] == ["language", "language", "vision", "vision", "other"]
    assert s.place(2).layer == 2 and s.place(2).module == "other"  # the fallback layer rule, as before
    assert any("3 tensors of no known module kind" in line for line in s.summary())


def test_columns_are_arrays_ready_for_grouping():
    s = structure_of([f"model.layers.{i}.mlp.experts.{e}.up_proj.weight" for i in range(3) for e in range(5)])
    cols = s.columns()
    assert set(cols) == {"tower", "layer", "module", "expert", "role"}
    assert cols["layer"].dtype.kind == "i" and len(cols["expert"]) == 15
    assert sorted(set(cols["expert"])) == [str(e) for e in range(5)]


def test_module_order_places_the_moe_block_after_attention():
    kinds = ["down", "expert down", "router", "q", "shared up", "expert gate", "norm", "embeddings", "lm_head"]
    assert in_module_order(kinds) == ["embeddings", "q", "router", "expert gate", "expert down", "shared up", "down",
                                      "norm", "lm_head"]
    assert MODULE_ORDER[-1] == "other"


@pytest.mark.parametrize("family", TEXT)
def test_text_families_write_one_layout_both_ways(families, family):
    saved = open_folder(families.base(family, "saved")).tensors
    dumped = open_folder(families.base(family, "state_dict")).tensors
    assert {n: e.shape for n, e in saved.items()} == {n: e.shape for n, e in dumped.items()}

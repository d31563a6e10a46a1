"""The Models and Heterogeneity pages (Streamlit AppTest) on MoE and vision-language sets: the base's structure, the
agents read in the base's layout, the towers and the MoE block drawn from the real analysis."""
from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from analysis import experts
from analysis.stats import analyze
from tests.app_helpers import APP_MAIN, plain

pytestmark = pytest.mark.timeout(600)


def _app(base, agents) -> AppTest:
    """The app opened on a selection, as a shared link opens it."""
    at = AppTest.from_file(str(APP_MAIN), default_timeout=300)
    at.query_params["base"] = str(base)
    at.query_params["agent"] = [str(a) for a in agents]
    return at


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [plain(e.value) for e in at.error]


def _figure(at: AppTest, key: str) -> dict:
    return json.loads([c for c in at.get("plotly_chart") if c.key == key][0].proto.spec)


def test_models_page_shows_structure_and_mapping(env, families):
    base = families.base("mixtral", "saved")
    agents = [families.agent("mixtral", 1, "state_dict"), families.agent("mixtral", 2, "saved")]
    at = _app(base, agents)
    at.switch_page("views/models.py").run()
    at.radio(key="model_source").set_value("Custom: local folders or Hub ids").run()
    at.text_input(key="custom_base").set_value(str(base)).run()
    at.text_area(key="custom_agents").set_value("\n".join(map(str, agents))).run()
    _ok(at)
    models = at.dataframe[0].value
    assert list(models["layout"]) == ["as stored", "mapped to the base's", "as stored"]
    assert list(models["tensors"]) == [41, 21, 41]  # each model's own count
    assert any("Compatible" in plain(s.value) for s in at.success)
    notes = [plain(i.value) for i in at.info if "Read in the base's layout" in plain(i.value)]
    assert len(notes) == 1 and "slices of 4 fused expert tensors" in notes[0] and "block_sparse_moe" in notes[0]
    assert any("mixture of experts: 2 layers" in plain(c.value) for c in at.caption)


def test_heterogeneity_draws_the_moe_block(env, families):
    base = families.base("qwen2_moe", "saved")
    agents = [families.agent("qwen2_moe", 1, "saved"), families.agent("qwen2_moe", 2, "state_dict")]
    at = _app(base, agents).run()
    _ok(at)
    res = analyze(base, agents)
    owners = experts.expert_owners(res, 1e-5)
    heat = _figure(at, "chart_density_layer_expert")
    assert [t["type"] for t in heat["data"]] == ["heatmap", "heatmap"]  # one panel per agent
    assert heat["data"][0]["x"] == ["0", "1", "2", "3", "shared", "router"]
    who = _figure(at, "chart_experts_changed_by")
    z = who["data"][0]["z"]
    only = {1: "agent1", 2: "agent2"}
    for row in owners.itertuples():
        code = z[int(row.layer)][int(row.expert)]
        assert (code is None) == (row.n_agents == 0)
        if row.n_agents == 1:
            assert only[code] == row.agents
        elif row.n_agents == 2:
            assert code == 3
    table = [d.value for d in at.dataframe if "routed experts changed" in d.value.columns][0]
    assert list(table["routed experts changed"]) == [f"{int(owners[f'changed:{a}'].sum())} of 8" for a in res.agents]


def test_heterogeneity_with_a_fused_base_says_what_it_cannot_show(env, families):
    base = families.base("qwen3_moe", "state_dict")
    agents = [families.agent("qwen3_moe", 1, "saved"), families.agent("qwen3_moe", 2, "state_dict")]
    at = _app(base, agents).run()
    _ok(at)
    assert any("stores its experts **fused**" in i.value for i in at.info)
    keys = {c.key for c in at.get("plotly_chart")}
    assert "chart_density_layer_expert" in keys and "chart_experts_changed_by" not in keys
    assert _figure(at, "chart_density_layer_expert")["data"][0]["x"] == ["fused", "router"]


def test_heterogeneity_shows_one_tower_at_a_time(env, families):
    base = families.base("llava", "state_dict")
    agents = [families.agent("llava", 1, "saved"), families.agent("llava", 2, "state_dict")]
    at = _app(base, agents).run()
    _ok(at)
    keys = {c.key for c in at.get("plotly_chart")}
    assert {"chart_density_per_tower", "chart_unique_share_per_tower"} <= keys
    assert "chart_density_layer_expert" not in keys

    def modules() -> set[str]:
        return set(_figure(at, "chart_density_layer_module")["data"][0]["y"])

    assert {"q", "gate", "lm_head"} <= modules() and "projector" not in modules()
    at.segmented_control(key="het_tower").set_value("vision").run()
    _ok(at)
    assert {"q", "up", "down", "projector"} <= modules() and not {"gate", "lm_head"} & modules()

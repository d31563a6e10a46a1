"""Every family transformers 5 ships for text, MoE and vision-language models, end to end through the CLI on tiny
real checkpoints (random init, written by save_pretrained and as a trainer's state_dict dump): `inspect`, `analyze`
(its grouping columns and counts), `merge` with RAM+, TIES and task arithmetic equal to an independent numpy
computation, and the output loading in transformers for a forward pass. Then the mixed layouts — per-expert base
with fused agents and the reverse, legacy vision-language names with prefixed ones and the reverse — merge to the
same bytes as the same agents written in the base's layout."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from ram_studio.cli import main
from tests.cli_helpers import run
from tests.families import FAMILIES, LAYOUTS, forward_ok, load
from tests.numpy_merges import expected_merge, read_folder, stored

METHODS = {"task_arithmetic": (["--lambda", "0.7"], {"lambda": 0.7}),
           "ties": (["--density", "0.3", "--lambda", "0.9"], {"density": 0.3, "lambda": 0.9}),
           "ram_plus": (["--eps", "1e-5", "--r", "0.1", "--alpha", "2.0"], {"eps": 1e-5, "r": 0.1, "alpha": 2.0})}
MIXED = [f for f, s in FAMILIES.items() if s.kind in ("moe", "vl")]
pytestmark = pytest.mark.timeout(900)


def _grouping(rows: list[dict], family: str, layout: str) -> None:
    """The CSV's tower, expert and role columns, as the family's structure has them."""
    kind = FAMILIES[family].kind
    by_tensor = {r["tensor"]: r for r in rows}
    towers = {r["tower"] for r in rows}
    assert towers == ({"language", "vision"} if kind == "vl" else {"language"})
    for name, r in by_tensor.items():
        if kind == "vl" and ("visual." in name or "vision_tower." in name or "multi_modal_projector" in name):
            assert r["tower"] == "vision", name
        if ".experts." in name:
            assert r["role"] == "expert" and r["expert"] == ("fused" if layout == "state_dict" else
                                                             name.split(".experts.")[1].split(".")[0]), name
            assert r["module"] in (("gate_up", "down") if layout == "state_dict" else ("gate", "up", "down")), name
        elif name.endswith((".mlp.gate.weight", "block_sparse_moe.gate.weight", "shared_expert_gate.weight",
                            ".mlp.gate.e_score_correction_bias")):
            assert (r["module"], r["role"], r["expert"]) == ("router", "router", ""), name
        elif ".shared_expert" in name:
            assert r["role"] == "shared_expert" and r["expert"] == "", name
        else:
            assert r["role"] == "" and r["expert"] == "", name
    assert not any(r["module"] == "other" for r in rows)


def _changed_counts(base, agents, eps: float) -> list[int]:
    """Elements each agent changed by more than ε (float32), over every float tensor: numpy."""
    b = read_folder(base)
    out = []
    for a in agents:
        ag = read_folder(a)
        out.append(sum(int((np.abs(ag[n][0] - v) > np.float32(eps)).sum()) for n, (v, d) in b.items()
                       if d in ("torch.bfloat16", "torch.float32")))
    return out


# Text families write the same names both ways (tests/merging/reading/test_structure.py checks it): one layout.
CASES = [(f, layout) for f, s in FAMILIES.items() for layout in (LAYOUTS if s.kind != "text" else LAYOUTS[:1])]


@pytest.mark.parametrize("family,layout", CASES)
def test_family_end_to_end(families, tmp_path, family, layout):
    base, agents = families.base(family, layout), families.agents(family, 2, layout)
    assert main(["inspect", str(base), *map(str, agents), "--json", str(tmp_path / "inspect.json")]) == 0
    report = json.loads((tmp_path / "inspect.json").read_text())
    assert report["mismatches"] == [] and report["unknown_tensors"] == []
    assert any(("vision" if FAMILIES[family].kind == "vl" else "language") in line for line in report["structure"])
    assert report["layouts"] == []  # base and agents written alike: nothing to map

    assert main(["analyze", str(base), *map(str, agents), "--csv", str(tmp_path / "stats.csv"), "--no-cache",
                 "--quiet", "--eps-ladder", "0,1e-5"]) == 0
    with open(tmp_path / "stats.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:7] == ["agent", "tensor", "tower", "layer", "module", "expert", "role"]
    _grouping([r for r in rows if r["agent"] == "agent1" and float(r["eps"]) == 1e-5], family, layout)
    changed = [sum(int(r["changed"]) for r in rows if r["agent"] == a and float(r["eps"]) == 1e-5)
               for a in ("agent1", "agent2")]
    assert changed == _changed_counts(base, agents, 1e-5)

    for method, (flags, params) in METHODS.items():
        dst = tmp_path / method
        assert main(["merge", str(base), *map(str, agents), "--method", method, "--out", str(dst), "--quiet",
                     *flags]) == 0
        got, want = stored(dst), expected_merge(base, agents, method, params)
        assert set(got) == set(want)
        for name in want:
            assert np.array_equal(got[name], want[name]), (method, name)
    model = load(tmp_path / "ram_plus", family)
    assert forward_ok(model)


def _merged_bytes(tmp_path, name: str, base, agents, method: str) -> bytes:
    dst = tmp_path / name
    assert main(["merge", str(base), *map(str, agents), "--method", method, "--out", str(dst), "--quiet",
                 *METHODS[method][0]]) == 0
    return b"".join(p.read_bytes() for p in sorted(dst.glob("*.safetensors")))


@pytest.mark.parametrize("base_layout,agent_layout", [("saved", "state_dict"), ("state_dict", "saved")])
@pytest.mark.parametrize("family", MIXED)
def test_mixed_layouts_merge_to_the_bytes_of_the_base_layout(families, tmp_path, capsys, family, base_layout,
                                                             agent_layout):
    from analysis.stats import analyze

    base = families.base(family, base_layout)
    same = families.agents(family, 2, base_layout)
    other = [families.agent(family, 1, agent_layout), families.agent(family, 2, base_layout)]
    mixed = [families.agent(family, 1, agent_layout), families.agent(family, 2, agent_layout)]
    for method in ("ram_plus", "ties"):
        want = _merged_bytes(tmp_path, f"{method}-same", base, same, method)
        assert _merged_bytes(tmp_path, f"{method}-mixed", base, mixed, method) == want, method
    assert _merged_bytes(tmp_path, "ta-one-other", base, other, "task_arithmetic") == \
        _merged_bytes(tmp_path, "ta-same", base, same, "task_arithmetic")
    a = analyze(base, same, use_cache=False).frame.drop(columns=["agent"])
    b = analyze(base, mixed, use_cache=False).frame.drop(columns=["agent"])
    assert a.equals(b)
    code, shown, err = run(capsys, "inspect", base, *mixed)
    assert code == 0, err
    assert "compatible" in shown and "(read in the base's layout)" in shown
    lines = [line for line in shown.splitlines() if line.startswith("layout: ")]
    assert {line.split(":")[1].strip() for line in lines} == {"agent1", "agent2"}
    kind = FAMILIES[family].kind
    assert any(("expert" if kind == "moe" else "read as the base's") in line for line in lines), lines

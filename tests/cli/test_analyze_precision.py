"""`ram-studio analyze`'s precision view end to end: the four JSON keys per agent and ε, `--eps-steps K` (the ladder
in representable steps, "density" at K steps), its refusals, and a merge with the step rule from the CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ram_studio.cli import main
from tests.factory import make_edge_family, ordinals, state, step_at

KEYS = ("chance_unique_share_binade", "one_step_share", "one_step_energy_share", "density_eps0")


@pytest.fixture(scope="module")
def fp16_family(tmp_path_factory):
    return make_edge_family(tmp_path_factory.mktemp("cli-prec"), torch.float16, 3, seed=5)


def brute_density(base, agents, k: float | None, eps: float | None = None) -> list[float]:
    """Each agent's share of elements with |τ| > K steps (or > ε; both None: stored value changed)."""
    b, out = state(base), []
    total = sum(t.numel() for t in b.values())
    for a in agents:
        s = state(a)
        n = 0
        for name, w in b.items():
            tau = (s[name].float() - w.float()).reshape(-1).numpy().astype(np.float64)
            if k is not None:
                n += int((np.abs(tau) > float(np.float32(k)) * step_at(w).reshape(-1)).sum())
            elif eps is not None:
                n += int((np.abs(tau) > float(np.float32(eps))).sum())
            else:
                n += int((s[name].double() != w.double()).sum())
        out.append(n / total)
    return out


def test_json_has_the_precision_keys(fp16_family, tmp_path, capsys):
    base, agents = fp16_family
    assert main(["analyze", str(base), *map(str, agents), "--json", str(tmp_path / "a.json"), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "stored value changed" in printed and "moved exactly one representable step" in printed
    assert "chance: model / tensor / binade" in printed
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["eps_unit"] == "abs"
    eps0 = brute_density(base, agents, None)
    for r in doc["agents"]:
        assert set(KEYS) <= set(r) and all(0.0 <= r[k] <= 1.0 for k in KEYS)
        assert r["density_eps0"] == pytest.approx(eps0[int(r["name"][-1])], rel=1e-12)
    at0 = [r for r in doc["agents"] if r["eps"] == 0.0]
    assert [r["density"] for r in at0] == pytest.approx(eps0, rel=1e-12)  # ε = 0: stored value changed
    one = []
    b = state(base)
    for a in agents:
        s = state(a)
        hits = sum(int((np.abs(ordinals(s[n]) - ordinals(b[n])) == 1).sum()) for n in b)
        one.append(hits / sum(int((s[n].double() != b[n].double()).sum()) for n in b))
    assert [r["one_step_share"] for r in at0] == pytest.approx(one, rel=1e-12)


@pytest.mark.parametrize("k", [0.5, 1.0, 2.5])
def test_eps_steps_changes_density(fp16_family, tmp_path, k):
    base, agents = fp16_family
    out = tmp_path / "s.json"
    assert main(["analyze", str(base), *map(str, agents), "--eps-steps", str(k), "--json", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    assert doc["eps_unit"] == "steps" and k in doc["eps"] and 0.0 in doc["eps"]
    at_k = [r for r in doc["agents"] if r["eps"] == k]
    assert [r["density"] for r in at_k] == pytest.approx(brute_density(base, agents, k), rel=1e-12)
    assert [r["changed"] for r in at_k] == [r["shared"] + r["unique"] for r in at_k]
    assert [r["density"] for r in at_k] != pytest.approx(brute_density(base, agents, None, 1e-5), rel=1e-6)
    if k >= 1:
        assert all(r["one_step_share"] == 0.0 for r in at_k)  # one step never exceeds K ≥ 1 steps


@pytest.mark.parametrize("k", ["0", "-1", "nan", "inf"])
def test_eps_steps_must_be_positive(fp16_family, tmp_path, capsys, k):
    base, agents = fp16_family
    assert main(["analyze", str(base), *map(str, agents), "--eps-steps", k, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--eps-steps" in err and "Traceback" not in err


def test_merge_with_the_step_rule_from_the_cli(fp16_family, tmp_path):
    """`merge --eps-steps K` runs RAM+ under the step rule; its recipe keeps K, and the merge differs from the
    absolute rule's."""
    base, agents = fp16_family
    args = [str(base), *map(str, agents), "--method", "ram_plus", "--quiet"]
    assert main(["merge", *args, "--eps-steps", "1", "--out", str(tmp_path / "steps")]) == 0
    assert main(["merge", *args, "--out", str(tmp_path / "abs")]) == 0
    recipe = json.loads((tmp_path / "steps" / "ram_recipe.json").read_text())
    assert json.dumps(recipe).count("eps_steps") >= 1
    a, b = state(tmp_path / "steps"), state(tmp_path / "abs")
    assert any(not torch.equal(a[n], b[n]) for n in a)

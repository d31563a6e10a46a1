"""Named presets, above all the RAM authors' public script's two rescaling modes: their λ values reproduced
from the script's formulas, and a merge with a preset equal to the script's merge rule computed directly."""
from __future__ import annotations

import json

import pytest
import torch

from merging.methods import get_method
from merging.methods.regions import lambdas_for
from merging.presets import PRESETS, SCRIPT_DEFAULT_R, SCRIPT_README_R, apply_preset
from ram_studio.cli import main
from tests.factory import state

COUNTS = [(5, 1), (4, 2), (2, 3), (0, 7), (1, 1), (123456, 654321), (654321, 123456), (3, 0), (0, 0),
          (109207, 20581), (30047, 2356), (112315, 85985)]  # the last three: the demo's counts at ε = 1e-5
FACTORS = [1.0, SCRIPT_DEFAULT_R, 1.1, SCRIPT_README_R, 1.5, 2.0, 3.0]


def script_v2(shared: int, unique: int, R: float) -> float | None:
    """The script's default mode (arm-r-v2), transcribed from its formula: ratio = overlap / (changed − overlap),
    rescale = 1 + (R − 1)·min(2, min(1, ratio)); R ≤ 1 counts as 1; unique = 0 with overlap divides by zero."""
    R = max(float(R), 1.0)
    changed = shared + unique
    if changed == 0:
        ratio = 0.0
    elif unique == 0:
        return None  # ZeroDivisionError in the script
    else:
        ratio = shared / (changed - shared)
    return 1.0 + (R - 1.0) * min(2, min(1.0, float(ratio)))


def script_r(shared: int, unique: int, R: float) -> float:
    """The script's older mode (arm-r): ratio = overlap / changed, rescale = 1 + (R − 1)·max(0, min(1, ratio))."""
    R = max(float(R), 1.0)
    changed = shared + unique
    ratio = 0.0 if changed == 0 else shared / changed
    return 1.0 + (R - 1.0) * max(0.0, min(1.0, float(ratio)))


@pytest.mark.parametrize("R", FACTORS)
@pytest.mark.parametrize("preset,script", [("authors-default", script_v2), ("authors-soft", script_r)])
def test_presets_reproduce_the_scripts_lambda(preset, script, R):
    """λ_t from our rule with the preset's parameters equals the script's value exactly (float64), for every
    count pair; where the script divides by zero we give the limit λ_t = R (it multiplies nothing)."""
    method, params = apply_preset(preset, None, {}, R)
    resolved = get_method(method).resolve_params(params)
    rule = "soft" if method == "ram_plus_soft" else "clip"
    shared, unique = zip(*COUNTS)
    ours = lambdas_for(shared, unique, resolved["r"], resolved.get("alpha"), rule)
    for (s, u), lam in zip(COUNTS, ours):
        expected = script(s, u, R)
        if expected is None:
            assert lam == R and u == 0
        else:
            assert lam == expected, (s, u, R)


def test_preset_parameters():
    assert apply_preset("authors-default", None, {}) == ("ram_plus", {"r": SCRIPT_DEFAULT_R - 1, "alpha": 1.0,
                                                                       "rho_scope": "global",
                                                                       "count_tied_twice": True})
    assert apply_preset("authors-soft", None, {"eps": "1e-6"}, 1.2) == \
        ("ram_plus_soft", {"eps": "1e-6", "r": 1.2 - 1.0, "rho_scope": "global", "count_tied_twice": True})
    assert apply_preset("paper", "ram_plus", {})[1] == {"r": 0.1, "alpha": 2.0, "rho_scope": "global"}
    assert apply_preset("mergekit-ramplus-tl", None, {})[1]["rho_scope"] == "tensor"
    for p in PRESETS.values():  # every preset's parameters are valid for its method
        get_method(p.method).resolve_params(p.params(1.2 if p.uses_r else None))


def reference_merge(base_dir, agent_dirs, eps: float, R: float, mode: str) -> dict[str, torch.Tensor]:
    """The script's merge rule in float32, written from its description: whole-model overlap counts, λ per
    agent, then per element the mean of the active updates where ≥ 2 changed, λ_t·τ_t where one did, 0 else."""
    b = {k: v.float() for k, v in state(base_dir).items()}
    taus = [{k: v.float() - b[k] for k, v in state(a).items()} for a in agent_dirs]
    n = len(taus)
    shared, unique = [0] * n, [0] * n
    for k in b:
        m = torch.stack([t[k].abs() > eps for t in taus])
        c = m.sum(0)
        for j in range(n):
            shared[j] += int((m[j] & (c >= 2)).sum())
            unique[j] += int((m[j] & (c == 1)).sum())
    lam = [(script_v2 if mode == "v2" else script_r)(s, u, R) for s, u in zip(shared, unique)]
    out = {}
    for k in b:
        d = torch.stack([t[k] for t in taus])
        m = (d.abs() > eps).float()
        count = m.sum(0)
        avg = (d * m).sum(0) / count.clamp(min=1.0)
        scaled = (d * m * torch.tensor(lam, dtype=torch.float32).view(-1, *[1] * (d.dim() - 1))).sum(0)
        out[k] = b[k] + torch.where(count >= 2, avg, torch.where(count == 1, scaled, torch.zeros_like(avg)))
    return out


@pytest.mark.parametrize("preset,mode,R", [("authors-default", "v2", SCRIPT_README_R),
                                           ("authors-default", "v2", SCRIPT_DEFAULT_R),
                                           ("authors-soft", "r", SCRIPT_README_R)])
def test_preset_merge_equals_the_scripts_rule(family, tmp_path, preset, mode, R, capsys):
    """`merge --preset` writes (in float32) exactly what the script's rule computes, and the card and recipe say
    which preset and R were used."""
    base, agents = family
    out = tmp_path / "merged"
    assert main(["merge", str(base), *map(str, agents), "--preset", preset, "--rescale-factor", str(R),
                 "--out", str(out), "--out-dtype", "float32", "--quiet"]) == 0
    expected = reference_merge(base, agents, 1e-5, R, mode)
    got = state(out)
    for k, v in expected.items():
        assert torch.equal(got[k], v), k
    card = (out / "README.md").read_text()
    recipe = json.loads((out / "ram_recipe.json").read_text())
    assert f"Preset {preset} with R = {R:g}" in card
    assert recipe["preset"]["name"] == preset and recipe["preset"]["rescale_factor"] == pytest.approx(R)


@pytest.mark.parametrize("argv,message", [
    (["--preset", "authors-default", "--r", "0.3"], "sets r=0.3"),
    (["--preset", "authors-soft", "--method", "ram_plus"], "is method ram_plus_soft"),
    (["--preset", "authors-default", "--rescale-factor", "0.9"], "must be a finite number ≥ 1"),
    (["--preset", "paper", "--rescale-factor", "1.2"], "takes no rescale factor"),
    (["--method", "ram_plus", "--rescale-factor", "1.2"], "goes with --preset"),
    ([], "no merge method given"),
])
def test_preset_mistakes_are_one_line(family, tmp_path, capsys, argv, message):
    base, agents = family
    assert main(["merge", str(base), *map(str, agents), "--out", str(tmp_path / "o"), "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0 and not (tmp_path / "o").exists()

"""The number format's view of "changed" (analysis.precision) against a brute-force numpy computation: the
per-tensor × binade chance of the unique share, the one-step shares, the density at ε = 0, and the ladder in
representable steps (analyze --eps-steps), on random bf16, fp16 and fp32 models with zeros, −0, subnormals and
powers of two, on every path of the pass. The brute force reads bit patterns as positions on the dtype's number
line (tests.factory.ordinals); it never uses the library's step tables."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis import ladder as ladder_module
from analysis.stats import PRECISION_COLUMNS, analyze
from analysis.tables import precision_view, unique_vs_chance
from tests.factory import EDGE_SHAPES as SHAPES
from tests.factory import make_edge_family, ordinals, state, step_at

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "bf16+fp32 norms": torch.bfloat16}
ABS = (0.0, 1e-6, 1e-5, 1e-4)
STEPS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
LONG = (0.0, 1e-8, 1e-7, 3e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3)  # > 8 values: the kernel's loop path
PATHS = {"kernel": {"RAM_STUDIO_KERNELS": "numba"}, "torch": {"RAM_STUDIO_KERNELS": "torch"},
         "gpu-style torch": {"RAM_STUDIO_KERNELS": "torch", "RAM_STUDIO_GPU_STYLE": "1"}}


# The first test waits for the numba kernels it needs, compiled here when the cache is cold (measured: 3 min on a
# 2-core machine under a load of 12), as long as the fixture's own limit.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module", autouse=True)
def _kernels_ready():
    """The pass runs the torch path until a kernel is ready: the kernel cases wait for it first."""
    from merging.kernels import kernels_enabled, wait_ready

    if kernels_enabled():
        assert wait_ready(("overlap_histogram",), ("bf16", "f32"), timeout=1800)


_MODELS: dict = {}


@pytest.fixture
def models(tmp_path_factory):
    def get(kind: str, n: int = 3):
        if (kind, n) not in _MODELS:
            _MODELS[(kind, n)] = make_edge_family(tmp_path_factory.mktemp("prec"), DTYPES[kind], n, seed=n + len(kind),
                                                  norms=torch.float32 if kind.endswith("norms") else None)
        return _MODELS[(kind, n)]
    return get


def brute(base_dir: Path, agent_dirs: list[Path], thresholds, steps: bool) -> dict:
    """Per (tensor, agent, threshold): changed/shared/unique, stored value changed, one-step count and Σ τ²,
    the chance unique count within binades (elements whose base weights have the same step), and the elements
    whose step exceeds ε — from the definitions."""
    b, ags = state(base_dir), [state(a) for a in agent_dirs]
    out = {}
    for name, w in b.items():
        step = step_at(w).reshape(-1)
        ob = ordinals(w).reshape(-1)
        tau = np.stack([(a[name].float() - w.float()).reshape(-1).numpy() for a in ags])
        x = tau.astype(np.float64)
        one = np.stack([np.abs(ordinals(a[name]).reshape(-1) - ob) == 1 for a in ags])
        stored = np.stack([a[name].double().reshape(-1).numpy() != w.double().reshape(-1).numpy() for a in ags])
        _, binade = np.unique(step, return_inverse=True)
        for e in thresholds:
            k32 = float(np.float32(e))
            m = np.abs(x) > (k32 * step if steps else k32)  # exact: float32 values and a power of two in float64
            c = m.sum(0)
            for t in range(len(ags)):
                chance = 0.0
                for bi in np.unique(binade):
                    sel = binade == bi
                    keep = np.prod([1 - m[s][sel].mean() for s in range(len(ags)) if s != t])
                    chance += m[t][sel].sum() * keep
                os = one[t] & m[t]
                out[(name, t, e)] = {
                    "changed": int(m[t].sum()), "shared": int((m[t] & (c >= 2)).sum()),
                    "unique": int((m[t] & (c == 1)).sum()), "changed_any": int(stored[t].sum()),
                    "one_step": int(os.sum()), "sq_one_step": float((x[t] ** 2)[os].sum()),
                    "sq_changed": float((x[t] ** 2)[m[t]].sum()), "chance_unique_binade": chance,
                    "eps_below_step": int(step.size * (e < 1.0) if steps else (step > k32).sum())}
    return out


def check_frame(res, expected: dict, thresholds) -> None:
    labels = res.agents
    for r in res.frame.to_dict("records"):
        if r["eps"] not in thresholds:
            continue
        e = expected[(r["tensor"], labels.index(r["agent"]), r["eps"])]
        where = (r["tensor"], r["agent"], r["eps"])
        for c in ("changed", "shared", "unique", "changed_any", "one_step", "eps_below_step"):
            assert r[c] == e[c], (*where, c, r[c], e[c])
        for c in ("sq_one_step", "chance_unique_binade"):
            assert math.isclose(r[c], e[c], rel_tol=1e-12, abs_tol=1e-300), (*where, c, r[c], e[c])
        sq = r["norm_unique"] ** 2 + r["norm_shared"] ** 2
        assert math.isclose(sq, e["sq_changed"], rel_tol=1e-9, abs_tol=1e-300), (*where, sq, e["sq_changed"])


def test_the_models_hold_every_edge_case(models):
    """The random models do exercise what the definitions single out."""
    for kind in ("bf16", "fp16", "fp32"):
        base, agents = models(kind)
        b, a = state(base), state(agents[0])
        w = torch.cat([t.reshape(-1).float() for t in b.values()])
        assert (w == 0).any() and torch.signbit(w[w == 0]).any() and (~torch.signbit(w[w == 0])).any()
        tiny = torch.finfo(DTYPES[kind]).tiny
        assert ((w != 0) & (w.abs() < tiny)).any()  # subnormals
        one = np.concatenate([np.abs(ordinals(a[k]).reshape(-1) - ordinals(b[k]).reshape(-1)) == 1 for k in b])
        assert one.sum() > 100
        half = np.concatenate([(np.abs(ordinals(a[k]) - ordinals(b[k])) == 1).reshape(-1)
                               & ((a[k].double().abs() < b[k].double().abs()).reshape(-1).numpy())
                               & (np.log2(np.abs(b[k].double().reshape(-1).numpy()) + 1e-300) % 1 == 0)
                               & (b[k].double().abs().reshape(-1).numpy() >= tiny) for k in b])
        assert half.sum() > 0  # one step toward zero from a power of two: half a step


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kind", list(DTYPES))
def test_precision_statistics_equal_brute_force(models, monkeypatch, kind, path):
    """Every precision column, per tensor × agent × ε, equals the definitions: bf16, fp16, fp32 and a bf16 model
    with fp32 norms; the fused kernel, the torch path and the GPU-style torch path; chunks split mid-tensor."""
    for k, v in PATHS[path].items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(ladder_module, "SLICE", 97)
    base, agents = models(kind)
    res = analyze(base, agents, ladder=ABS, chunk_elems=500, use_cache=False)
    check_frame(res, brute(base, agents, ABS, steps=False), ABS)


@pytest.mark.parametrize("path", ["kernel", "torch"])
@pytest.mark.parametrize("kind", ["bf16", "fp16", "fp32"])
def test_a_ladder_in_steps_equals_brute_force(models, monkeypatch, kind, path):
    """The ladder in representable steps (|τ| > K steps of the stored dtype at the base weight): counts and
    precision columns equal the definitions, K from 0 (stored value changed) over half steps to 3."""
    for k, v in PATHS[path].items():
        monkeypatch.setenv(k, v)
    base, agents = models(kind)
    res = analyze(base, agents, ladder=STEPS, chunk_elems=700, use_cache=False, unit="steps")
    assert res.unit == "steps"
    check_frame(res, brute(base, agents, STEPS, steps=True), STEPS)


@pytest.mark.parametrize("n,ladder,joint", [(3, LONG, True), (3, ABS, False), (5, ABS, False), (4, STEPS, True)])
def test_both_strategies_and_every_kernel_branch(models, monkeypatch, n, ladder, joint):
    """The per-ε loop strategy (forced, or 5 agents) and the kernel's long-ladder loop give the definitions too."""
    if not joint:
        monkeypatch.setattr(ladder_module, "joint_fits", lambda n_agents, ladder_len: False)
    steps = ladder is STEPS
    base, agents = models("bf16", n)
    res = analyze(base, agents, ladder=ladder, chunk_elems=600, use_cache=False, unit="steps" if steps else "abs")
    check_frame(res, brute(base, agents, ladder[::3] if len(ladder) > 6 else ladder, steps), ladder[::3]
                if len(ladder) > 6 else ladder)


@pytest.mark.parametrize("unit,ladder", [("abs", ABS), ("steps", STEPS)])
def test_kernel_and_torch_paths_give_the_same_numbers(models, monkeypatch, unit, ladder):
    """The kernels (small tensors in batches, decoded in the kernel) and torch give the same precision statistics:
    every count exactly, the sums (Σ τ² of one-step changes, the binade chance) up to the order of float64
    additions."""
    base, agents = models("fp16")
    frames = []
    for kernels in ("numba", "torch"):
        monkeypatch.setenv("RAM_STUDIO_KERNELS", kernels)
        frames.append(analyze(base, agents, ladder=ladder, chunk_elems=333, use_cache=False, unit=unit).frame)
    for c in (*PRECISION_COLUMNS, "changed", "shared", "unique"):
        if c in ("sq_one_step", "chance_unique_binade"):
            assert np.allclose(frames[0][c], frames[1][c], rtol=1e-12, atol=0), c
        else:
            assert frames[0][c].tolist() == frames[1][c].tolist(), c


def test_whole_model_views_equal_brute_force(models):
    """unique_vs_chance's per-tensor × binade chance and precision_view's shares, per agent over the whole
    model, from the brute-force per-tensor numbers."""
    base, agents = models("bf16")
    res = analyze(base, agents, ladder=ABS, use_cache=False)
    e = brute(base, agents, ABS, steps=False)
    total = sum(int(np.prod(s)) for s in SHAPES.values())
    for eps in ABS:
        uvc = unique_vs_chance(res, eps).set_index("agent")
        pv = precision_view(res, eps).set_index("agent")
        for t, agent in enumerate(res.agents):
            rows = [v for (name, a, x), v in e.items() if a == t and x == eps]
            changed = sum(r["changed"] for r in rows)
            assert uvc.loc[agent, "chance_unique_share_binade"] == pytest.approx(
                sum(r["chance_unique_binade"] for r in rows) / changed, rel=1e-12)
            assert pv.loc[agent, "density_eps0"] == pytest.approx(sum(r["changed_any"] for r in rows) / total)
            assert pv.loc[agent, "one_step_share"] == pytest.approx(sum(r["one_step"] for r in rows) / changed)
            assert pv.loc[agent, "one_step_energy_share"] == pytest.approx(
                sum(r["sq_one_step"] for r in rows) / sum(r["sq_changed"] for r in rows), rel=1e-9)
        below = sum(v["eps_below_step"] for (name, a, x), v in e.items() if a == 0 and x == eps)
        assert pv["eps_below_step_share"].iloc[0] == pytest.approx(below / total)


def test_the_binade_chance_lies_between_measured_and_tensor_chance_on_the_demo():
    """On the bundled demo (bf16), the numbers the README quotes: the per-tensor × binade chance of the unique
    share sits between the measured share and the per-tensor chance for every agent, and most changed
    elements are one step or a few from the base."""
    res = analyze("demo:base", ["demo:code", "demo:tool", "demo:memory"], use_cache=False)
    uvc = unique_vs_chance(res, 1e-5)
    assert (uvc["unique_share"] <= uvc["chance_unique_share_binade"]).all()
    assert (uvc["chance_unique_share_binade"] <= uvc["chance_unique_share_tensor"]).all()
    pv = precision_view(res, 1e-5)
    assert (pv["one_step_share"] > 0.3).all() and pv["eps_below_step_share"].iloc[0] > 0.9

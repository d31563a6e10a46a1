"""The step rule (merging.methods.steps; RAM / RAM+ `eps_steps`): |τ| > K representable steps of the base's stored
dtype at the base weight, against an independent numpy computation (bit patterns read as positions on the dtype's
number line, tests.factory.step_at) — the thresholds, and whole RAM / RAM+ merges through the engine on the fused
kernels and on torch, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from merging.methods import get_method, regions
from merging.methods.steps import Steps, step_thresholds, thresholds
from tests.factory import edge_base, make_edge_family, ordinals, state, step_at

CODES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


# The first test waits for the numba kernels it needs, compiled here when the cache is cold (measured: 13 min on a
# 2-core machine under a load of 12), as long as the fixture's own limit.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module", autouse=True)
def _kernels_ready():
    """The engine runs the torch path until a kernel is ready: the kernel cases wait for them first."""
    from merging.kernels import kernels_enabled, wait_ready

    if kernels_enabled():
        assert wait_ready(("ram", "count_and_peak", "first_nonfinite", "values_differ"), ("bf16", "f32"), timeout=1800)


@pytest.mark.parametrize("dtype", list(CODES))
@pytest.mark.parametrize("k", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 1e-3, 0.1])
def test_thresholds_are_k_steps_at_the_base_weight_exactly(dtype, k):
    """|τ| > threshold ⇔ |τ| > K·step in exact arithmetic, for τ at, just below and just above K steps, at zeros,
    −0, subnormals, powers of two and ordinary weights of bf16, fp16 and fp32."""
    g = torch.Generator().manual_seed(3)
    w = edge_base((4000,), dtype, g)
    exact = float(np.float32(k)) * step_at(w)  # float64: a float32 K times a power of two, exact
    thr = thresholds(w.float(), k, CODES[dtype]).numpy()
    at = exact.astype(np.float32)
    for tau in (at, np.nextafter(at, np.float32(np.inf)), np.nextafter(at, np.float32(0)), at * np.float32(1.0001),
                torch.randn(4000, generator=g).abs().numpy().astype(np.float32) * exact.astype(np.float32) * 2):
        assert np.array_equal(tau > thr, tau.astype(np.float64) > exact)
    assert np.array_equal(thr,
                          step_thresholds([k], CODES[dtype])[0][(w.float().view(torch.int32) >> 23 & 0xFF).numpy()])


def test_thresholds_beyond_float32_never_mark_a_finite_update():
    w = torch.tensor([3.0e38, 1.0, 0.0], dtype=torch.float32)
    thr = thresholds(w, 1e30, "F32")
    assert thr[0] == torch.finfo(torch.float32).max and not bool((torch.tensor([3.0e38]) > thr[0]).any())


def reference_merge(base_dir, agent_dirs, method: str, params: dict) -> dict[str, torch.Tensor]:
    """RAM / RAM+ (Eq. 6-7) under the step rule in numpy: masks |τ| > K·step (float64, exact), counts over the whole
    model or per tensor, λ_t, then the float32 merge in the kernels' order, rounded to the base's dtype by torch."""
    b, ags = state(base_dir), [state(a) for a in agent_dirs]
    k = float(np.float32(params["eps_steps"]))
    taus, masks = {}, {}
    for name, w in b.items():
        tau = np.stack([(a[name].float() - w.float()).reshape(-1).numpy() for a in ags])
        taus[name] = tau
        masks[name] = np.abs(tau.astype(np.float64)) > k * step_at(w).reshape(-1)

    def lambdas(names):
        lam = []
        for t in range(len(ags)):
            shared = sum(int((masks[n][t] & (masks[n].sum(0) >= 2)).sum()) for n in names)
            unique = sum(int((masks[n][t] & (masks[n].sum(0) == 1)).sum()) for n in names)
            r = params.get("r", 0.0)
            if shared + unique == 0:
                lam.append(1.0)
            elif method == "ram_plus_soft":
                lam.append(1.0 + r * (shared / (shared + unique)))
            else:
                rho = shared / unique if unique else float("inf")
                lam.append(1.0 + r * min(max(rho, 0.0), params.get("alpha", 2.0)))
        return np.array(lam, np.float32)

    out = {}
    global_lam = lambdas(list(b))
    for name, w in b.items():
        tau, m = taus[name], masks[name]
        lam = lambdas([name]) if params.get("rho_scope") == "tensor" else global_lam
        c = m.sum(0)
        total = np.zeros(tau.shape[1], np.float32)
        for t in range(len(ags)):
            total = total + np.where(m[t], tau[t], np.float32(0))
        one = (np.where(m, tau * lam[:, None], np.float32(0))).sum(0, dtype=np.float32) if method != "ram" else total
        merged = np.where(c >= 2, total / np.maximum(c, 1).astype(np.float32), np.where(c == 1, one, np.float32(0)))
        out32 = w.float().reshape(-1).numpy() + merged.astype(np.float32)
        out[name] = torch.from_numpy(out32).to(w.dtype).view(w.shape)
    return out


CASES = [("ram", {"eps_steps": 1.0}), ("ram", {"eps_steps": 0.5}), ("ram_plus", {"eps_steps": 1.0}),
         ("ram_plus", {"eps_steps": 2.0, "r": 0.3, "alpha": 0.5, "rho_scope": "tensor"}),
         ("ram_plus_soft", {"eps_steps": 1.5, "r": 0.2})]


@pytest.mark.parametrize("kernels", ["numba", "torch"])
@pytest.mark.parametrize("dtype", list(CODES))
@pytest.mark.parametrize("method,params", CASES)
def test_step_rule_merges_equal_numpy(tmp_path_factory, monkeypatch, dtype, kernels, method, params):
    """A RAM / RAM+ merge under the step rule, through the engine (counting pass, per-tensor passes, chunks split
    mid-tensor), equals the numpy reference bit for bit, on the fused kernels and on torch."""
    from merging.merge import merge_to_folder
    from merging.recipe import MergeSpec

    monkeypatch.setenv("RAM_STUDIO_KERNELS", kernels)
    root = tmp_path_factory.mktemp("steps")
    base, agents = make_edge_family(root, dtype, 3, seed=7)
    merge_to_folder(MergeSpec(str(base), [str(a) for a in agents], method, params, str(root / "out"),
                              chunk_elems=301))
    got = state(root / "out")
    want = reference_merge(base, agents, method, get_method(method).resolve_params(params))
    for name, w in want.items():
        assert torch.equal(got[name].view(torch.int16 if dtype != torch.float32 else torch.int32),
                           w.view(torch.int16 if dtype != torch.float32 else torch.int32)), name


def test_the_step_rule_is_not_the_absolute_rule(tmp_path_factory):
    """On bf16 weights, one step of the stored dtype is above ε = 1e-5 almost everywhere: at K = 1 the one-step
    changes drop out of the regions (so the rule changes the merge), and K = 0 counts every stored change."""
    root = tmp_path_factory.mktemp("differ")
    base, agents = make_edge_family(root, torch.bfloat16, 3, seed=2)
    w, a = state(base)["model.embed_tokens.weight"], [state(x)["model.embed_tokens.weight"] for x in agents]
    taus = torch.stack([x.float() - w.float() for x in a]).reshape(3, -1)
    one_step = torch.from_numpy(np.stack([np.abs(ordinals(x) - ordinals(w)).reshape(-1) == 1 for x in a]))
    m1 = regions.changed_by(taus, Steps(1.0), w.float().reshape(-1), "BF16")
    assert one_step.any() and not (m1 & one_step).any()
    m0 = regions.changed_by(taus, Steps(0.0), w.float().reshape(-1), "BF16")
    assert torch.equal(m0, taus != 0)


def test_mergekit_has_no_equivalent_when_the_step_rule_is_set():
    for method in ("ram", "ram_plus", "ram_plus_soft"):
        m = get_method(method)
        plain = m.mergekit.write(m.resolve_params({}), 3)
        steps = m.mergekit.write(m.resolve_params({"eps_steps": 1.0}), 3)
        assert not steps.exact and "no equivalent of the step rule" in steps.note
        assert method == "ram_plus_soft" or plain.exact or "step rule" not in plain.note


def test_the_sweep_can_vary_the_step_rule():
    from evaluation.grid import parse_try

    labels = [c.label for c in parse_try("ram eps_steps=0,1,2").expand()]
    assert labels == ["ram eps_steps=0.0", "ram eps_steps=1.0", "ram eps_steps=2.0"]


def test_counts_are_taken_from_an_analysis_only_in_its_unit(tmp_path_factory):
    """A cached analysis in absolute ε never answers for the step rule (nor the reverse), whatever the numbers."""
    from analysis.stats import analyze

    root = tmp_path_factory.mktemp("units")
    base, agents = make_edge_family(root, torch.bfloat16, 2, seed=4)
    abs_res = analyze(base, agents, ladder=(0.0, 1.0), use_cache=False)
    steps_res = analyze(base, agents, ladder=(0.0, 1.0), use_cache=False, unit="steps")
    assert abs_res.covers(1.0) and not abs_res.covers(Steps(1.0))
    assert steps_res.covers(Steps(1.0)) and not steps_res.covers(1.0)
    assert steps_res.counts_at(Steps(1.0)) != abs_res.counts_at(1.0)
    with pytest.raises(Exception, match="not in the analysed ladder"):
        steps_res.counts_at(1.0)

"""Properties the issue asks for: disjoint ⇒ sum, identical ⇒ that agent, r=0 ⇒ RAM, TA(1/N) = average,
chunked = unchunked bit for bit, global vs tensor-local ρ on a crafted case, DARE order independence."""
import pytest
import torch

from merging.common.errors import RamStudioError
from merging.engine.tensor_merge import merge_in_memory
from merging.methods import get_method, regions

ALL = ["average", "task_arithmetic", "ties", "dare_ta", "dare_ties", "ram", "ram_plus", "ram_plus_soft"]


def sparse_taus(n=3, e=5000, seed=0, densities=(0.05, 0.4, 0.5)):
    g = torch.Generator().manual_seed(seed)
    taus = torch.randn(n, e, generator=g) * 1e-3
    mask = torch.rand(n, e, generator=g) < torch.tensor(densities[:n]).view(-1, 1)
    return taus * mask


def test_disjoint_agents_ram_is_base_plus_sum():
    taus = torch.zeros(3, 300)
    for t in range(3):
        taus[t, t * 100:(t + 1) * 100] = torch.randn(100) * 1e-2 + 0.5  # all above ε
    assert torch.equal(merge_in_memory("ram", taus), taus.sum(0))


def test_identical_agents_ram_is_that_agent():
    one = sparse_taus(1)[0] + 0.0
    one[one.abs() <= 1e-5] = 0.0
    taus = one.expand(3, -1).clone()
    base = torch.randn(one.shape).to(torch.bfloat16).float()
    agent = (base + one).to(torch.bfloat16)
    merged = (base + merge_in_memory("ram", taus)).to(torch.bfloat16)
    assert torch.equal(merged, agent)


def test_r_zero_ram_plus_equals_ram_bitwise():
    taus = sparse_taus()
    ram = merge_in_memory("ram", taus)
    for scope in ("global", "tensor"):
        assert torch.equal(merge_in_memory("ram_plus", taus, {"r": 0.0, "rho_scope": scope}), ram)


def test_task_arithmetic_one_over_n_is_average():
    taus = sparse_taus()
    assert torch.equal(merge_in_memory("task_arithmetic", taus, {"lambda": 1 / 3}),
                       merge_in_memory("average", taus))


@pytest.mark.parametrize("method", ALL)
@pytest.mark.parametrize("chunk", [1, 7, 100, 599])
def test_chunked_equals_unchunked_bitwise(method, chunk):
    taus = sparse_taus(e=600)
    params = {"density": 0.3} if method == "ties" else {}
    whole = merge_in_memory(method, taus, params)
    assert torch.equal(merge_in_memory(method, taus, params, chunk_elems=chunk), whole)


def test_ties_keeps_exactly_k_with_ties_broken_by_index():
    # All magnitudes equal: the k lowest flat indices are kept whatever the chunking.
    taus = torch.full((1, 10), 0.5)
    for chunk in (None, 3):
        out = merge_in_memory("ties", taus, {"density": 0.3}, chunk_elems=chunk)
        assert out.tolist() == [0.5, 0.5, 0.5] + [0.0] * 7


def test_global_rho_differs_from_tensor_rho_on_crafted_case():
    # Two tensors of one model. Agent 0 is all-unique in tensor X and all-shared in tensor Y.
    x = torch.tensor([[1., 1, 0, 0], [0, 0, 1, 0]])      # agent0: unique 2; agent1: unique 1
    y = torch.tensor([[1., 1, 1, 1], [1, 1, 1, 1]])      # both: shared 4
    counts = regions.count_lists(regions.counts(torch.cat([x, y], 1), 1e-5))    # global: agent0 shared 4 unique 2 → ρ 2
    assert counts == {"shared": [4, 4], "unique": [2, 1]}
    glob = merge_in_memory("ram_plus", x, {"r": .1, "alpha": 10}, counts=counts)
    local = merge_in_memory("ram_plus", x, {"r": .1, "alpha": 10, "rho_scope": "tensor"})
    # global λ: agent0 1 + .1·2 = 1.2; agent1 1 + .1·4 = 1.4. Tensor-local ρ in X is 0 → λ = 1.
    assert torch.allclose(glob, torch.tensor([1.2, 1.2, 1.4, 0]))
    assert torch.equal(local, torch.tensor([1., 1, 1, 0]))


def test_dare_masks_follow_position_not_names():
    """Keep masks are keyed by the agent's position (merging.methods.base.agent_seed_keys),
    never by its name or how its path was spelled: same inputs, same order, same parameters → same merge."""
    taus = sparse_taus()
    a = merge_in_memory("dare_ta", taus, {"drop_rate": .5}, agents=["code", "tool", "memory"])
    b = merge_in_memory("dare_ta", taus, {"drop_rate": .5}, agents=["./m/code/", "demo:tool", "/abs/memory"])
    assert torch.equal(a, b)
    c = merge_in_memory("dare_ta", taus[[2, 0, 1]], {"drop_rate": .5}, agents=["memory", "code", "tool"])
    assert not torch.equal(a, c)  # another order draws other masks (documented)
    d = merge_in_memory("dare_ta", taus, {"drop_rate": .5, "seed": 1}, agents=["code", "tool", "memory"])
    assert not torch.equal(a, d)


def test_dare_keep_rate_matches_p():
    taus = torch.ones(1, 200_000)
    out = merge_in_memory("dare_ta", taus, {"drop_rate": 0.3})
    kept = (out != 0).float().mean().item()
    assert abs(kept - 0.7) < 0.01
    assert torch.allclose(out[out != 0], torch.tensor(1 / 0.7))


@pytest.mark.parametrize("method,params,fragment", [
    ("ram", {"eps": -1}, "eps"),
    ("ram_plus", {"r": -0.1}, "r"),
    ("ram_plus", {"alpha": -1}, "alpha"),
    ("ram_plus", {"rho_scope": "layer"}, "rho_scope"),
    ("ties", {"density": 0}, "density"),
    ("ties", {"density": 1.5}, "density"),
    ("dare_ta", {"drop_rate": 1.0}, "drop_rate"),
    ("dare_ta", {"drop_rate": -0.1}, "drop_rate"),
    ("ram", {"lambda": 1}, "lambda"),
    ("ram", {"eps": float("nan")}, "eps"),
])
def test_invalid_parameters_are_clear_errors(method, params, fragment):
    with pytest.raises(RamStudioError) as info:
        get_method(method).resolve_params(params)
    assert fragment in str(info.value)


def test_unknown_method():
    with pytest.raises(RamStudioError, match="unknown merge method"):
        get_method("regmean")


def test_a_parameter_declared_in_the_wrong_order_fails_at_declaration():
    """Param's bounds are keywords: a declaration giving them positionally (help in the bounds' place) is refused
    when the method file is imported, instead of a traceback inside a user's merge."""
    import pytest

    from merging.methods.params import Param

    with pytest.raises(TypeError, match="keywords"):
        Param("scale", float, 0.5, 0.0, 1.0, "Scale of the sum.", "s (scale)")
    with pytest.raises(TypeError, match="numbers"):
        Param("scale", float, 0.5, "Scale of the sum.", low="0")
    assert Param("scale", float, 0.5, "Scale of the sum.", low=0.0, high=1.0, label="s").high == 1.0

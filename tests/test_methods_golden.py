"""Golden vectors worked out by hand from each method's definition (cases A, B and DARE; docs/methods.md states the
definitions), compared exactly."""
import pytest
import torch

from merging.engine.tensor_merge import merge_in_memory
from merging.methods import regions
from merging.methods.base import ChunkContext
from merging.methods.dare import drop_and_rescale
from merging.methods.regions import lambda_for, rho

TINY = 2.0 ** -20
A = torch.tensor([
    [.5, -.25, .75, 1, 0, -.125, 0, 0],
    [.1875, .25, -.5, 0, -.75, 0, -.375, 0],
    [-1, 0, .5, .25, 0, 0, -.625, TINY],
])
B = torch.tensor([
    [.5, -.25, .75, .125, -.375, 1, 0, 0, 0, 0, 0, 0],
    [.25, .25, -.5, -.125, 0, 0, -.75, .625, 0, 0, 0, TINY],
    [-1, 0, 0, 0, .875, 0, 0, 0, .375, -.0625, .5, 0],
])


def close(x, y):
    return torch.allclose(x, torch.tensor(y, dtype=torch.float32), atol=1e-7, rtol=0)


@pytest.mark.parametrize("chunk", [None, 1, 3, 5])
def test_case_a_all_methods(chunk):
    assert torch.equal(merge_in_memory("task_arithmetic", A, {"lambda": 1}, chunk_elems=chunk),
                       torch.tensor([-.3125, 0, .75, 1.25, -.75, -.125, -1, TINY]))
    assert torch.equal(merge_in_memory("ties", A, {"density": .5, "lambda": 1}, chunk_elems=chunk),
                       torch.tensor([-1, .25, .625, .625, -.75, 0, -.5, 0]))
    assert close(merge_in_memory("ram", A, chunk_elems=chunk), [-0.3125 / 3, 0, .25, .625, -.75, -.125, -.5, 0])
    assert close(merge_in_memory("ram_plus", A, {"r": .1, "alpha": 2}, chunk_elems=chunk),
                 [-0.3125 / 3, 0, .25, .625, -.9, -.15, -.5, 0])


def test_case_a_rho_and_lambda():
    counts = regions.count_lists(regions.counts(A, 1e-5))
    assert counts == {"shared": [4, 4, 4], "unique": [1, 1, 0]}
    assert [rho(s, u) for s, u in zip(counts["shared"], counts["unique"])] == [4, 4, float("inf")]
    assert [lambda_for(s, u, .1, 2.0) for s, u in zip(counts["shared"], counts["unique"])] == pytest.approx([1.2] * 3)


def test_case_b_counts_rho_ram_and_ram_plus():
    counts = regions.count_lists(regions.counts(B, 1e-5))
    assert counts == {"shared": [5, 4, 2], "unique": [1, 2, 3]}
    assert [rho(s, u) for s, u in zip(counts["shared"], counts["unique"])] == pytest.approx([5, 2, 2 / 3])
    lam = [lambda_for(s, u, .1, 2.0) for s, u in zip(counts["shared"], counts["unique"])]
    assert lam == pytest.approx([1.2, 1.2, 1.0666667])
    assert close(merge_in_memory("ram", B), [-1 / 12, 0, .125, 0, .25, 1, -.75, .625, .375, -.0625, .5, 0])
    plus = merge_in_memory("ram_plus", B)
    assert close(plus[5:11], [1.2, -.9, .75, .4, -.0666667, .5333333])
    assert close(plus[:5], [-1 / 12, 0, .125, 0, .25]) and plus[11] == 0


def test_case_b_mergekit_ramplus_tl_defaults():
    out = merge_in_memory("ram_plus", B, {"rho_scope": "tensor", "alpha": .2})
    assert close(out[5:11], [1.02, -.765, .6375, .3825, -.06375, .51])


def test_dare_fixed_mask_golden():
    ctx = ChunkContext("t", 0, 8, ("a",), {"drop_rate": .5, "seed": 0})
    keep = torch.tensor([1, 0, 1, 1, 0, 1, 0, 1], dtype=torch.bool)
    # The fixed mask of the reference replaces our hashed one; the rescale rule is what is checked.
    import merging.methods.dare as dare

    original = dare.keep_mask
    dare.keep_mask = lambda ctx, agent, count, device: keep
    try:
        out = drop_and_rescale(A[:1], ctx)
    finally:
        dare.keep_mask = original
    assert torch.equal(out[0], torch.tensor([1, 0, 1.5, 2, 0, -.25, 0, 0]))


def test_soft_rule_is_shared_over_total():
    # Eq. 8-9: λ = 1 + r·ρ/(1+ρ) = 1 + r·shared/(shared+unique)
    assert lambda_for(5, 1, .1, 2.0, "soft") == pytest.approx(1 + .1 * 5 / 6)
    assert lambda_for(4, 0, .1, 2.0, "soft") == pytest.approx(1.1)
    assert lambda_for(0, 0, .1, 2.0, "soft") == 1.0
    assert lambda_for(0, 0, .1, 2.0, "clip") == 1.0

"""The Signal dilution page's toy merges with the methods' own functions (merging/methods/whole.py), not the merge
engine: the same values as the engine's in-memory merge, bit for bit, for every setting the page offers."""
from __future__ import annotations

import itertools

import pytest
import torch

from analysis.toy import TOY_EPS, toy_merges, toy_taus
from merging.engine.tensor_merge import merge_in_memory
from merging.methods import METHODS
from merging.methods.whole import merge_whole


@pytest.mark.parametrize("seed,densities,overlap", itertools.product(
    [0, 7], [[0.05, 0.3, 0.6], [0.2, 0.2], [0.1, 0.2, 0.3, 0.4, 0.5]], [0.0, 0.4, 1.0]))
def test_the_toy_shows_the_engines_numbers(seed, densities, overlap):
    taus = toy_taus(densities, [overlap] * len(densities), seed)
    for r, alpha in [(0.0, 0.5), (0.1, 2.0), (0.5, 1.0)]:
        got = toy_merges(taus, r, alpha)
        want = {"average": merge_in_memory("average", taus),
                "RAM": merge_in_memory("ram", taus, {"eps": TOY_EPS}),
                "RAM+": merge_in_memory("ram_plus", taus, {"eps": TOY_EPS, "r": r, "alpha": alpha,
                                                           "rho_scope": "global"})}
        assert list(got) == list(want)
        for name in want:
            assert got[name].shape == want[name].shape and torch.equal(got[name], want[name]), (name, r, alpha)
    if overlap < 1.0:  # unique updates exist: averaging and RAM differ there, so the comparison can fail
        assert not torch.equal(got["average"], got["RAM"])


@pytest.mark.parametrize("method", sorted(m for m, spec in METHODS.items() if spec.side_tensors is None))
def test_a_whole_tensor_merge_is_the_engines(method):
    """Every method without side tensors, its passes (TIES' threshold) and random masks (DARE) included."""
    taus = toy_taus([0.3, 0.45, 0.6], [0.5, 0.5, 0.5], 3) * torch.linspace(0.5, 1.5, 128)
    params = {"agent": 1} if "agent" in {p.name for p in METHODS[method].params if p.required} else {}
    assert torch.equal(merge_whole(method, taus, params), merge_in_memory(method, taus, params))

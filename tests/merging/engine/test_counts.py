"""Whole-model counts with per-tensor weights (a tied embedding counted twice): the same on the fused CPU kernels
and the torch path, whatever the chunking, and equal to the stored-once counts plus the weighted tensor's own."""
from __future__ import annotations

import pytest
import torch

from merging.engine.counts import (
    count_overlaps,
    counts_tied_twice,
    stored_tensor_weights,
)
from merging.methods import regions
from merging.reading.checkpoint import open_checkpoint
from tests.factory import make_agent, make_base, state

EMBED = "model.embed_tokens.weight"


# The first test waits for the numba kernels it needs, compiled here when the cache is cold (a minute or two of
# CPU); a warm cache makes it seconds.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    root = tmp_path_factory.mktemp("tied")
    base = make_base(root / "base", tie=True)
    return base, [make_agent(base, root / f"a{i}", d, seed=40 + i) for i, d in enumerate((0.1, 0.3, 0.5))]


@pytest.mark.parametrize("kernels", ["numba", "torch"])
@pytest.mark.parametrize("chunk_elems", [500, 1 << 20])
def test_weighted_counts(tied, monkeypatch, kernels, chunk_elems):
    from merging.kernels import statistics, wait_ready

    monkeypatch.setenv("RAM_STUDIO_KERNELS", kernels)
    fused_calls = []
    if kernels == "numba":
        pytest.importorskip("merging.kernels.numba_import")
        assert wait_ready(("count_and_peak", "ram") + ("first_nonfinite", "values_differ"), ("bf16",))
        real = statistics.count_and_peak
        monkeypatch.setattr(statistics, "count_and_peak", lambda *a: fused_calls.append(1) or real(*a))
    base, agents = tied
    b, ags = open_checkpoint(base), [open_checkpoint(a) for a in agents]
    weights = stored_tensor_weights(b, {"count_tied_twice": True})
    assert weights == {EMBED: 2} and stored_tensor_weights(b, {"count_tied_twice": False}) is None
    cpu = torch.device("cpu")
    once = count_overlaps(b, ags, 1e-5, device=cpu, chunk_elems=chunk_elems)
    twice = count_overlaps(b, ags, 1e-5, device=cpu, chunk_elems=chunk_elems, weights=weights)
    tau = torch.stack([state(a)[EMBED].float() - state(base)[EMBED].float() for a in agents])
    embed = regions.counts(tau, 1e-5)
    assert twice.shared == [s + int(e) for s, e in zip(once.shared, embed[:, 0])]
    assert twice.unique == [u + int(e) for u, e in zip(once.unique, embed[:, 1])]
    assert twice.max_abs_tau == once.max_abs_tau and int(embed.sum()) > 0
    assert bool(fused_calls) is (kernels == "numba")  # the path named is the path taken


def test_the_switch_is_read_from_parameters():
    assert counts_tied_twice({"count_tied_twice": True}) and not counts_tied_twice({"r": 0.1})

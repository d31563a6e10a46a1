"""The effective scale F_t / ΣF of Fisher merging on unique and shared elements against a direct computation on
whole tensors (numpy), on a tiny real family with random Fisher files."""
from __future__ import annotations

import numpy as np
import torch

from analysis.fisher_scale import effective_scales
from merging.reading.checkpoint import open_checkpoint
from merging.reading.side_tensors import open_side_file
from tests.factory import state
from tests.merging.methods.test_fisher import family, fisher_files


def test_effective_scales_equal_a_direct_computation(tmp_path):
    base, agents = family(tmp_path, torch.bfloat16)
    files = fisher_files(tmp_path, base, 3)
    got = effective_scales(open_checkpoint(base), [open_checkpoint(a) for a in agents],
                           [open_side_file(f, "fisher") for f in files], eps=1e-5, floor=1e-6)
    from safetensors.torch import load_file

    b, ag, fs = state(base), [state(a) for a in agents], [load_file(f) for f in files]
    names = [k for k in b if b[k].is_floating_point()]
    taus = np.stack([np.concatenate([(a[k].float() - b[k].float()).numpy().ravel() for k in names]) for a in ag])
    fis = np.stack([np.concatenate([f[k].numpy().ravel() for k in names]) for f in fs]) + np.float32(1e-6)
    scale = fis / fis.sum(0)
    m = np.abs(taus) > np.float32(1e-5)
    c = m.sum(0)
    for region, where in (("unique", c == 1), ("shared", c >= 2)):
        for t, label in enumerate(a.name for a in agents):
            sel = m[t] & where
            row = got[(got.agent == label) & (got.region == region)].iloc[0]
            assert row.elements == int(sel.sum()) > 0
            assert np.isclose(row.mean_scale, scale[t][sel].mean(), rtol=1e-6)
            assert np.isclose(row.below_1_over_n, (scale[t][sel] < 1 / 3).mean())
            a = np.abs(taus[t][sel]).astype(np.float64)
            assert np.isclose(row.update_kept, (scale[t][sel] * a).sum() / a.sum(), rtol=1e-6)
            assert abs(row["median"] - np.quantile(scale[t][sel], 0.5, method="inverted_cdf")) <= 1 / 2000
    assert (got.loc[got.region == "unique", "mean_scale"] < 1).all()  # App. D: no unique update kept whole

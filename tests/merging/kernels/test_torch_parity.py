"""The fused CPU kernels give exactly the bits of the torch reference path (which also runs on GPUs)."""
from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest
import torch

from analysis.ladder import DEFAULT_LADDER, overlap_accumulator
from merging.engine.tensor_merge import merge_in_memory
from merging.reading.chunk_inputs import ChunkInputs
from ram_studio.cli import main

pytest.importorskip("merging.kernels.numba_import")  # numba, through the import every kernel module uses


# The first test waits for the numba kernels, compiled here when the cache is cold (all of them: about 3 min of CPU,
# much longer on a loaded machine); a warm cache makes it seconds.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module", autouse=True)
def _kernels_ready():
    """The engine runs the torch path until a kernel is ready (compiled in the background on a fresh
    checkout): these tests compare the two paths, so they wait for every kernel first."""
    from merging.kernels import wait_ready

    assert wait_ready()

CASES = [
    ("ram", {}), ("ram_plus", {}), ("ram_plus", {"rho_scope": "tensor", "alpha": 0.2}), ("ram_plus_soft", {}),
    ("ram_plus", {"eps": 3e-6, "r": 0.37}), ("average", {}), ("task_arithmetic", {"lambda": 0.3}),
    ("ties", {"density": 0.2, "lambda": 0.7}), ("ties", {"density": 1.0}), ("ties", {"density": 1e-6}),
    ("dare_ta", {"drop_rate": 0.3, "lambda": 0.5}), ("dare_ties", {"drop_rate": 0.7, "seed": 3}),
    ("dare_ta", {"drop_rate": 0.0}),
]


def inputs(seed: int = 0, n: int = 3, e: int = 20_000):
    """bf16-valued base and agents with the awkward cases: τ at ε, zero and −0 bases, repeated magnitudes."""
    g = torch.Generator().manual_seed(seed)
    base = (torch.randn(e, generator=g) * 0.02).to(torch.bfloat16).float()
    base[:50] = -0.0
    base[50:100] = 0.0
    density = torch.tensor([[.05], [.4], [.5], [.3]][:n])
    taus = torch.randn(n, e, generator=g) * 1e-3 * (torch.rand(n, e, generator=g) < density)
    taus[:, 100:200] = 1e-5  # exactly at the threshold in float64 terms
    taus[:, 200:300] = float(np.float32(1e-5))
    taus[0, 300:400] = 0.25  # many equal magnitudes: TIES ties broken by index
    agents = (base + taus).to(torch.bfloat16).float()
    return base, agents - base


@pytest.mark.parametrize("method,params", CASES)
@pytest.mark.parametrize("chunk", [None, 777])
def test_fused_equals_torch_bitwise(method, params, chunk):
    base, taus = inputs()
    ref = merge_in_memory(method, taus, params, base=base, chunk_elems=chunk, agents=["a", "b", "c"])
    fused = merge_in_memory(method, taus, params, base=base, chunk_elems=chunk, agents=["a", "b", "c"], fused=True)
    assert torch.equal(ref.view(torch.int32), fused.view(torch.int32))


LONG_LADDER = (-0.0, 1e-8, 1e-7, 3e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3)  # > 8 values: the loop path


@pytest.mark.parametrize("n,ladder", [(3, DEFAULT_LADDER), (1, DEFAULT_LADDER), (2, DEFAULT_LADDER),
                                      (4, DEFAULT_LADDER), (3, LONG_LADDER)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_histogram_equals_torch(dtype, n, ladder):
    base, taus = inputs(1, n=n)
    agents = (base + taus).to(dtype)
    base = base.to(dtype)
    torch_acc, fused_acc = overlap_accumulator(n, ladder), overlap_accumulator(n, ladder)
    for lo in range(0, base.numel(), 6000):
        hi = lo + 6000
        code = "BF16" if dtype == torch.bfloat16 else "F32"
        torch_acc.add(agents[:, lo:hi].float() - base[lo:hi].float(), base[lo:hi].float(), code)
        chunk = ChunkInputs(base[lo:hi].contiguous(), list(agents[:, lo:hi]), torch.device("cpu"), True)
        fused_acc.add_chunk(chunk, fused=True, dtype=code)
    a, b = torch_acc.result(), fused_acc.result()
    for field in ("changed", "shared", "unique", "hist", "conflicts", "pair_both", "pair_agree"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    for field in ("sq_unique", "sq_shared", "pair_dot", "pair_sq_a", "pair_sq_b", "dot_others", "sq_others",
                  "dominated"):  # float64 sums in another order; the dominance intervals select the same elements
        x, y = getattr(a, field), getattr(b, field)
        assert torch.allclose(x, y, rtol=1e-12, atol=1e-12 * float(a.sq_shared.max())), field


@pytest.mark.parametrize("method,extra", [("ram_plus", []), ("ties", ["--density", "0.3"]),
                                          ("dare_ties", []), ("unique_only", ["--agent", "agent1"])])
def test_engine_outputs_identical_with_and_without_kernels(family, tmp_path, monkeypatch, method, extra):
    base, agents = family
    digests = []
    for mode in ("torch", "numba"):
        monkeypatch.setenv("RAM_STUDIO_KERNELS", mode)
        out = tmp_path / mode
        assert main(["merge", str(base), *map(str, agents), "--method", method, "--out", str(out), "--quiet",
                     "--chunk-elems", "500", *extra]) == 0
        digests.append({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.glob("*.safetensors")})
    assert digests[0] == digests[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 1e-5, 3e-4])
def test_counting_kernel_equals_the_rule(dtype, eps):
    """The fused shared/unique counter is the rule of merging/methods/regions.py, bit for bit."""
    from merging.kernels.common import parts
    from merging.kernels.statistics import overlap_counts
    from merging.methods import regions

    base, taus = inputs(2)
    agents = (base + taus).to(dtype)
    chunk = ChunkInputs(base.to(dtype).contiguous(), list(agents), torch.device("cpu"), True)
    b, a = chunk.raw()
    fused = torch.from_numpy(overlap_counts(b, a, np.float32(eps), parts(b.size)))
    assert torch.equal(fused, regions.counts(agents.float() - base.to(dtype).float(), eps))


def test_counting_pass_is_the_same_on_both_paths(family, monkeypatch):
    """The global-ρ counting pass gives the same counts through the kernels and through torch."""
    from merging.engine.counts import count_overlaps
    from merging.reading.checkpoint import open_checkpoint

    base, agents = family
    got = []
    for kernels in ("numba", "torch"):
        monkeypatch.setenv("RAM_STUDIO_KERNELS", kernels)
        oc = count_overlaps(open_checkpoint(base), [open_checkpoint(a) for a in agents], 1e-5,
                            device=torch.device("cpu"), chunk_elems=999)
        got.append((oc.shared, oc.unique, oc.max_abs_tau))
    assert got[0] == got[1] and min(got[0][1]) > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_output_checks_agree_with_and_without_kernels(dtype):
    """The non-finite scan and the change detector give the same answers through numba and numpy."""
    from merging.common.errors import RamStudioError
    from merging.writing.output_check import OutputGuard

    base = torch.tensor([0.0, -0.0, 1.5, -2.0], dtype=dtype)
    for out, changed in ((base.clone(), False), (-base, True),
                         (torch.tensor([-0.0, 0.0, 1.5, -2.0], dtype=dtype), False)):
        for fused in (True, False):
            g = OutputGuard("x", _fused=fused)
            g.check("t", 0, out, base)
            assert g.changed is changed, (out, fused)
    bad = base.clone()
    bad[2] = float("inf")
    for fused in (True, False):
        with pytest.raises(RamStudioError, match="flat index 12"):
            OutputGuard("x", _fused=fused).check("t", 10, bad, base)


def test_first_pass_never_waits_for_a_compile(family, tmp_path, monkeypatch):
    """A fresh install (no kernel in numba's cache): the merge and the analysis run the torch path while
    the kernels compile in the background, and give the same bits as with the kernels."""
    import merging.kernels as kernels
    from merging.kernels import warm

    base, agents = family
    args = [str(base), *map(str, agents)]
    assert main(["merge", *args, "--method", "ram_plus", "--out", str(tmp_path / "warm"), "--quiet",
                 "--chunk-elems", "500"]) == 0  # kernels ready: the fused path
    warm_stats = analyze_json(args, tmp_path / "warm.json")

    release = threading.Event()
    started = threading.Event()
    real_warm = warm.warm

    def slow_warm(name, dtype):  # a compile that does not end before the test says so
        started.set()
        release.wait(120)
        return real_warm(name, dtype)

    monkeypatch.setattr(kernels, "_WARMUP", kernels.Warmup())
    monkeypatch.setattr(kernels, "cached_marker_exists", lambda dtype, names=(): False)
    monkeypatch.setattr(warm, "warm", slow_warm)
    try:
        assert main(["merge", *args, "--method", "ram_plus", "--out", str(tmp_path / "cold"), "--quiet",
                     "--chunk-elems", "500"]) == 0
        cold_stats = analyze_json(args, tmp_path / "cold.json")
        assert started.is_set() and not kernels.ready(("ram",), "bf16")  # it finished without them
    finally:
        release.set()
    for p in (tmp_path / "warm").glob("*.safetensors"):
        assert p.read_bytes() == (tmp_path / "cold" / p.name).read_bytes()
    # counts exact; the shares and cosines from float64 sums up to the order of the additions (small tensors are
    # summed in batches by a kernel of their own, large ones through the joint-state histogram)
    assert len(cold_stats["agents"]) == len(warm_stats["agents"])
    for cold, hot in zip(cold_stats["agents"], warm_stats["agents"]):
        assert cold.keys() == hot.keys()
        for k, v in cold.items():
            if isinstance(v, float):
                assert v == pytest.approx(hot[k], rel=1e-12, abs=1e-15), k
            else:
                assert v == hot[k], k


def analyze_json(args, out):
    import json

    assert main(["analyze", *args, "--quiet", "--no-cache", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_a_kernel_made_ready_once_is_waited_for_by_the_next_process(tmp_path, monkeypatch):
    """A merge that starts without a counting pass (the app, or the CLI after `analyze`) used to
    wait for its kernels only after a full warm-up of every kernel had been noted; otherwise it merged its
    first tensor on the torch path while they loaded. Each kernel made ready is now noted on its own, and
    `settle` waits for kernels noted so (loaded from numba's cache), never for one never made ready."""
    import merging.kernels as kernels
    from merging.kernels import marker, warm

    def in_tmp(dtype, kernel=None):
        return str(tmp_path / f"{dtype}-{kernel or 'all'}.ready")

    monkeypatch.setattr(marker, "marker_path", in_tmp)
    monkeypatch.setattr(kernels, "marker_path", in_tmp)
    monkeypatch.setattr(kernels, "_WARMUP", kernels.Warmup())
    assert not kernels.cached_marker_exists("bf16", ("ram",))
    assert kernels.wait_ready(("ram",), ("bf16",))  # this process makes it ready: noted for the next one
    assert (tmp_path / "bf16-ram.ready").exists() and not (tmp_path / "bf16-all.ready").exists()
    assert kernels.cached_marker_exists("bf16", ("ram",))
    assert not kernels.cached_marker_exists("bf16", ("ram", "linear"))  # linear was never made ready

    # The next process: the load takes a while; settle waits for it because the kernel is noted.
    release = threading.Event()
    real_warm = warm.warm

    def slow_load(name, dtype):
        release.wait(60)
        return real_warm(name, dtype)

    monkeypatch.setattr(kernels, "_WARMUP", kernels.Warmup())
    monkeypatch.setattr(warm, "warm", slow_load)
    kernels.prepare(("ram", "linear"), ("bf16",), wait=False)
    threading.Timer(0.2, release.set).start()
    kernels.settle(("ram",), "bf16")
    assert kernels.ready(("ram",), "bf16")
    kernels.settle(("linear",), "bf16")  # never noted: may be a compile, so no wait (it may be ready by chance)
    release.set()


def test_a_merge_without_passes_switches_to_the_kernels_within_a_tensor(family, tmp_path, monkeypatch):
    """Kernels that become ready while the first tensor is being merged are used from its next chunk on
    (a merge without passes has no state across chunks); the output is the same, bit for bit."""
    import merging.engine.loop as engine
    from merging.merge import merge_to_folder
    from merging.recipe import MergeSpec

    base, agents = family
    spec = MergeSpec(str(base), [str(a) for a in agents], "ram", {}, str(tmp_path / "ref"), chunk_elems=500)
    merge_to_folder(spec)
    calls = []
    real_fused_now = engine.fused_now

    def late(device, names, dtype, first=False):  # not ready for the first two asks, then ready
        calls.append(first)
        return len(calls) > 2 and real_fused_now(device, names, dtype, first=first)

    made = []

    class Recording(engine.TensorMerger):
        def __init__(self, method, params, tensor, *rest, fused=False):
            made.append((tensor, fused))
            super().__init__(method, params, tensor, *rest, fused=fused)

    monkeypatch.setattr(engine, "fused_now", late)
    monkeypatch.setattr(engine, "TensorMerger", Recording)
    merge_to_folder(MergeSpec(**{**spec.__dict__, "out": str(tmp_path / "late")}))
    first = made[0][0]
    assert [f for t, f in made if t == first] == [False, True]  # switched inside the first tensor
    assert all(f for t, f in made[2:])
    for p in (tmp_path / "ref").glob("*.safetensors"):
        assert p.read_bytes() == (tmp_path / "late" / p.name).read_bytes()

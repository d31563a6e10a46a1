"""The I/O pipeline's knobs never change a result: reader threads, chunk sizes, the torch path that runs
on GPUs (exercised here on the CPU: deferred checks, device lanes, whole tensors assembled for methods
with passes), and writes by offset in any order."""
from __future__ import annotations

import hashlib
import json
import random

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from merging.common.device import Lanes
from merging.kernels import wait_ready
from merging.reading.checkpoint import open_checkpoint
from merging.reading.chunks import BufferPool, ChunkReader, row_spans
from merging.writing.shards import PlannedTensor, ShardSetWriter, plan_shards
from ram_studio.cli import main
from tests.factory import make_agent, make_base, state

METHODS = [("ram_plus", []), ("ram_plus", ["--rho-scope", "tensor"]), ("ties", ["--density", "0.3"]),
           ("dare_ties", []), ("task_arithmetic", ["--lambda", "0.7"])]


def merged(family, out, method, extra, chunk):
    base, agents = family
    assert main(["merge", str(base), *map(str, agents), "--method", method, "--out", str(out), "--quiet",
                 "--chunk-elems", str(chunk), *extra]) == 0
    shards = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.safetensors"))}
    inputs = json.loads((out / "ram_recipe.json").read_text())["inputs"]
    return shards, inputs


# The first test waits for the numba kernels, compiled here when the cache is cold (all of them: about 3 min of CPU,
# much longer on a loaded machine); a warm cache makes it seconds.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module", autouse=True)
def _kernels_ready():
    assert wait_ready()


@pytest.mark.parametrize("method,extra", METHODS)
def test_reader_threads_and_chunks_never_change_outputs_or_fingerprints(family, tmp_path, monkeypatch, method, extra):
    seen = []
    for threads, chunk in ((1, 1 << 23), (2, 700), (4, 333), (3, 1 << 23)):
        monkeypatch.setenv("RAM_STUDIO_READ_THREADS", str(threads))
        seen.append(merged(family, tmp_path / f"t{threads}-{chunk}", method, extra, chunk))
    assert all(s == seen[0] for s in seen)


@pytest.mark.parametrize("method,extra", METHODS)
@pytest.mark.parametrize("assemble", ["0", str(64 << 20)])
def test_gpu_path_on_the_cpu_gives_the_kernels_bits(family, tmp_path, monkeypatch, method, extra, assemble):
    """The torch path as it runs on a GPU (RAM_STUDIO_GPU_STYLE=1): output checks on the device, writes
    after the copy-out, whole tensors assembled for methods with passes (or not, with no room)."""
    from merging.reading.chunk_inputs import ChunkInputs

    ref = merged(family, tmp_path / "kernels", method, extra, 500)
    assembled = []
    real = ChunkInputs.on_device.__func__
    monkeypatch.setattr(ChunkInputs, "on_device",
                        classmethod(lambda cls, *a, **k: assembled.append(1) or real(cls, *a, **k)))
    monkeypatch.setenv("RAM_STUDIO_KERNELS", "torch")
    monkeypatch.setenv("RAM_STUDIO_GPU_STYLE", "1")
    monkeypatch.setenv("RAM_STUDIO_ASSEMBLE_BYTES", assemble)
    for chunk in (500, 1 << 23):
        assert merged(family, tmp_path / f"gpu-{chunk}", method, extra, chunk) == ref
    has_passes = method == "ties" or "tensor" in extra
    assert bool(assembled) == (has_passes and assemble != "0")


def test_gpu_style_analysis_and_counts_equal_the_kernels(family, monkeypatch):
    from analysis.stats import analyze
    from merging.engine.counts import count_overlaps

    base, agents = family
    models = [open_checkpoint(base), *map(open_checkpoint, agents)]
    ref = analyze(base, agents, use_cache=False, chunk_elems=999)
    ref_counts = count_overlaps(models[0], models[1:], 1e-5, device=torch.device("cpu"), chunk_elems=999)
    monkeypatch.setenv("RAM_STUDIO_KERNELS", "torch")
    monkeypatch.setenv("RAM_STUDIO_GPU_STYLE", "1")
    got = analyze(base, agents, use_cache=False, chunk_elems=999)
    counts = count_overlaps(models[0], models[1:], 1e-5, device=torch.device("cpu"), chunk_elems=999)
    cols = ["agent", "tensor", "eps", "changed", "shared", "unique", "sign_conflicts", "k1", "k2", "k3"]
    assert ref.frame[cols].equals(got.frame[cols])
    diff = (ref.frame["norm_unique"] - got.frame["norm_unique"]).abs()
    assert (diff <= 1e-12 * ref.frame["norm_unique"] + 1e-15).all()
    assert (counts.shared, counts.unique, counts.max_abs_tau) == \
        (ref_counts.shared, ref_counts.unique, ref_counts.max_abs_tau)


def test_analysis_is_the_same_for_every_thread_count(family, monkeypatch):
    """Fixed partitions: even the float64 sums of squares do not depend on numba's thread count."""
    from analysis.stats import analyze
    from merging.kernels.numba_import import numba

    base, agents = family
    frames = []
    for threads in (1, numba.config.NUMBA_NUM_THREADS):
        numba.set_num_threads(threads)
        try:
            frames.append(analyze(base, agents, use_cache=False, chunk_elems=1 << 20).frame)
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert frames[0].equals(frames[1])


@pytest.mark.parametrize("threads", [1, 3])
def test_chunk_reader_returns_the_stored_rows(family, threads):
    base_dir, agent_dirs = family
    base, agents = open_checkpoint(base_dir), [open_checkpoint(a) for a in agent_dirs]
    reader = ChunkReader(base, agents, threads=threads, pool=BufferPool(keep=2))
    try:
        spans = [s for n in sorted(base.tensors) for s in row_spans(n, base.tensors[n].shape, 257)]
        for span, data in reader.stream((s, s) for s in spans):
            for model, got in zip([base, *agents], [data.base, *data.agents]):
                entry = model.tensors[span.tensor]
                with safe_open(str(entry.file), "pt") as f:
                    want = f.get_tensor(span.tensor)
                want = want[span.start:span.stop] if want.dim() else want
                assert got is not None and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
            if data.stage is not None:
                assert torch.equal(data.stage[0], data.base.reshape(-1))
            data.release()
    finally:
        reader.close()


def test_writes_by_offset_in_any_order_make_the_same_files(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {f"t{i}": torch.randn(int(torch.randint(1, 50, (1,), generator=g)), 7, generator=g) for i in range(9)}
    plan = plan_shards([PlannedTensor(n, "F32", tuple(t.shape)) for n, t in tensors.items()], 600)
    digests = []
    for order in ("sequential", "shuffled"):
        folder = tmp_path / order
        folder.mkdir()
        sink = ShardSetWriter(folder, plan, {"format": "pt"})
        pieces = [(n, o, t.reshape(-1)[o // 4:o // 4 + 13]) for n, t in tensors.items()
                  for o in range(0, t.numel() * 4, 52)]
        if order == "shuffled":
            random.Random(1).shuffle(pieces)
        for name, offset, piece in pieces:
            sink.write_at(name, offset, piece.numpy().tobytes())
        index = sink.finish()
        digests.append(({p.name: p.read_bytes() for p in folder.iterdir()}, index))
    assert digests[0] == digests[1]
    for name, t in tensors.items():
        with safe_open(str(tmp_path / "sequential" / digests[0][1]["weight_map"][name]), "pt") as f:
            assert torch.equal(f.get_tensor(name), t)


def test_incomplete_output_is_refused(tmp_path):
    sink = ShardSetWriter(tmp_path, [[PlannedTensor("a", "F32", (4,))]], {})
    sink.write_at("a", 0, b"\0" * 8)
    with pytest.raises(RuntimeError, match="not every planned tensor"):
        sink.finish()
    sink.abort()
    with pytest.raises(RuntimeError, match="outside tensor"):
        ShardSetWriter(tmp_path, [[PlannedTensor("a", "F32", (4,))]], {}).write_at("a", 12, b"\0" * 8)


def test_lanes_on_the_cpu_hand_tensors_through():
    lanes = Lanes(torch.device("cpu"))
    x = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    up, event = lanes.upload(x)
    assert event is None and up.dtype == torch.float32 and up.tolist() == [1.5, -2.0]
    down, event = lanes.download(up)
    assert down is up and event is None
    host = torch.empty(2)
    assert lanes.download(up, host)[0] is host and host.tolist() == [1.5, -2.0]


def test_buffer_pool_reuses_buffers():
    pool = BufferPool(keep=2)
    a = pool.take(1000)
    pool.give(a[:10].view(torch.int16))  # any view of it hands back the whole buffer
    b = pool.take(900)
    assert b.data_ptr() == a.data_ptr() and b.numel() >= 1000


HUGE_LAYER = "model.layers.99999999999999999999.mlp.up_proj.weight"


def test_odd_but_legal_tensors_are_analysed_and_merged(tmp_path):
    """A zero-element bf16 tensor (legal in safetensors: it used to stop the reader with a traceback, zero
    bytes cannot be viewed as bf16 rows) and a layer number beyond int64 in a name pass through the analysis
    and every kind of merge."""
    base = make_base(tmp_path / "base", shard=None)
    shard = base / "model.safetensors"
    tensors = load_file(shard)
    tensors["model.layers.0.mlp.empty_buffer"] = torch.zeros(0, dtype=torch.bfloat16)
    tensors[HUGE_LAYER] = torch.randn(8, 4).to(torch.bfloat16)
    save_file(tensors, shard, metadata={"format": "pt"})
    agents = [make_agent(base, tmp_path / f"agent{i}", d, seed=7 + i) for i, d in enumerate((0.3, 0.5))]
    inputs = [str(base), *map(str, agents)]
    csv = tmp_path / "stats.csv"
    assert main(["analyze", *inputs, "--no-cache", "--quiet", "--csv", str(csv)]) == 0
    assert HUGE_LAYER in csv.read_text() and "empty_buffer" in csv.read_text()
    for method in ("ram_plus", "ties", "dare_ties", "task_arithmetic"):
        out = tmp_path / f"out-{method}"
        assert main(["merge", *inputs, "--method", method, "--out", str(out), "--quiet"]) == 0
        merged = state(out)
        assert merged["model.layers.0.mlp.empty_buffer"].shape == (0,)
        assert merged["model.layers.0.mlp.empty_buffer"].dtype == torch.bfloat16

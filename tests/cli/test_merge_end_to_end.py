"""End to end through the CLI: sharded bf16 Qwen2 inputs → merge → transformers loads the output."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ram_studio.cli import main
from tests.factory import state
from tests.paths import REPO_ROOT


def sha(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.safetensors"))}


def merge(family, out: Path, *extra: str) -> int:
    base, agents = family
    return main(["merge", str(base), *map(str, agents), "--out", str(out), "--quiet", *extra])


def test_cli_subprocess_merge_loads_in_transformers(family, tmp_path):
    base, agents = family
    out = tmp_path / "merged"
    proc = subprocess.run([sys.executable, "-m", "merging", "merge", str(base), *map(str, agents),
                           "--method", "ram_plus", "--out", str(out), "--shard-size", "30KB"],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "λ" in proc.stdout
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) >= 2 and all(p.name.endswith(f"-of-{len(shards):05d}.safetensors") for p in shards)
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    total = 0
    for p in shards:
        with safe_open(str(p), "pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                assert index["weight_map"][name] == p.name
                total += t.numel() * t.element_size()
    assert index["metadata"]["total_size"] == total
    assert set(index["weight_map"]) == set(state(base))

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=False)
    tok = AutoTokenizer.from_pretrained(out, trust_remote_code=False)
    assert model.dtype == torch.bfloat16
    ids = tok("hello", return_tensors="pt").input_ids
    logits = model(ids).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits.float()).all()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16" and "torch_dtype" not in cfg  # one dtype key, as transformers 5 writes

    card = (out / "README.md").read_text()
    front = card.split("---")[1]
    assert "library_name: transformers" in front
    assert "- merge" in front and "- ram" in front
    assert "base_model" not in front and str(base) not in front  # local folders are not Hub ids
    assert str(base) in card.split("---", 2)[2]  # the body still names every input
    assert "λ_t" in card and "ram_recipe.json" in card
    recipe = json.loads((out / "ram_recipe.json").read_text())
    assert recipe["spec"]["method"] == "ram_plus" and recipe["spec"]["params"]["r"] == 0.1
    assert len(recipe["inputs"]) == 4 and recipe["inputs"][0]["files"][0]["header_sha256"]
    assert len(recipe["lambdas"]) == 3 and "torch" in recipe["versions"]


def test_merged_values_match_in_memory_ram_plus(family, tmp_path):
    """The streamed output equals base + merge_in_memory over the whole model, cast to bf16."""
    from merging.engine.tensor_merge import merge_in_memory
    from merging.methods import regions

    base, agents = family
    out = tmp_path / "m"
    assert merge(family, out, "--method", "ram_plus", "--chunk-elems", "100") == 0
    b = state(base)
    ags = [state(a) for a in agents]
    names = sorted(b)
    flat = torch.cat([torch.stack([a[n].float().reshape(-1) - b[n].float().reshape(-1) for a in ags]) for n in names],
                     1)
    counts = regions.count_lists(regions.counts(flat, 1e-5))
    got = state(out)
    for n in names:
        taus = torch.stack([a[n].float() - b[n].float() for a in ags])
        expect = (b[n].float() + merge_in_memory("ram_plus", taus, counts=counts)).to(torch.bfloat16)
        assert torch.equal(got[n], expect), n


@pytest.mark.parametrize("method,extra", [
    ("ram_plus", []), ("ties", ["--density", "0.3"]), ("dare_ties", ["--drop-rate", "0.3"]),
    ("ram_plus", ["--rho-scope", "tensor"]), ("average", []),
])
def test_bit_identical_across_chunk_sizes_and_runs(family, tmp_path, method, extra):
    hashes = []
    for i, chunk in enumerate(["64", "1000", str(1 << 23), "64"]):
        out = tmp_path / f"o{i}"
        assert merge(family, out, "--method", method, "--chunk-elems", chunk, *extra) == 0
        hashes.append(sha(out))
    assert all(h == hashes[0] for h in hashes)


def test_recipe_rerun_reproduces_identical_shards(family, tmp_path):
    out = tmp_path / "first"
    assert merge(family, out, "--method", "dare_ties", "--drop-rate", "0.4", "--seed", "7",
                 "--shard-size", "30KB") == 0
    again = tmp_path / "again"
    assert main(["run", str(out / "ram_recipe.json"), "--out", str(again), "--quiet"]) == 0
    assert sha(out) == sha(again) and len(sha(out)) >= 2


def test_out_dtype_float32_and_config(family, tmp_path):
    out = tmp_path / "f32"
    assert merge(family, out, "--method", "ram", "--out-dtype", "float32") == 0
    assert all(t.dtype == torch.float32 for t in state(out).values())
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"


def test_existing_output_refused_unless_overwrite(family, tmp_path, capsys):
    """A non-empty folder is refused; --overwrite replaces only a folder RAM Studio wrote, never a user's."""
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert merge(family, out, "--method", "ram") == 2
    assert "not empty" in capsys.readouterr().err
    assert merge(family, out, "--method", "ram", "--overwrite") == 2
    assert "refusing to overwrite" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"
    ours = tmp_path / "ours"
    assert merge(family, ours, "--method", "ram") == 0
    first = (ours / "ram_recipe.json").read_text()
    assert merge(family, ours, "--method", "task_arithmetic", "--overwrite") == 0
    assert (ours / "ram_recipe.json").read_text() != first and (ours / "config.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder, lock or old copy left


def test_analyze_json(family, tmp_path):
    base, agents = family
    doc_path = tmp_path / "a.json"
    assert main(["analyze", str(base), *map(str, agents), "--eps-ladder", "0,1e-6,1e-5", "--json", str(doc_path),
                 "--quiet"]) == 0
    doc = json.loads(doc_path.read_text())
    assert doc["eps"] == [0, 1e-6, 1e-5] and doc["total_params"] == sum(t.numel() for t in state(base).values())
    assert len(doc["agents"]) == 9
    row = next(r for r in doc["agents"] if r["name"] == "agent0" and r["eps"] == 1e-5)
    assert row["changed"] == row["shared"] + row["unique"]
    assert 0.02 < row["density"] < 0.08  # agent0 was made with a 5 % density
    assert row["rho"] == pytest.approx(row["shared"] / row["unique"])


def test_inspect_reports_and_errors(family, tmp_path, capsys):
    base, agents = family
    assert main(["inspect", str(base), *map(str, agents)]) == 0
    out = capsys.readouterr().out
    assert "Qwen2ForCausalLM" in out and "compatible" in out
    assert main(["inspect", str(base), str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_process_entry_point_exits_fast_but_completely(family, tmp_path):
    """`ram_studio.cli.run` exits through the interpreter's own exit, made quick: what a command printed arrives
    through a pipe (a block-buffered stdout), an executor nobody shut down does not hang the exit, atexit handlers
    run, and the exit code is the command's (tests/cli/test_process.py: threads left running, Ctrl-C at exit)."""
    base, agents = family
    script = ("import atexit, concurrent.futures, sys\n"
              "from ram_studio import cli\n"
              "atexit.register(lambda: print('atexit handler ran', file=sys.stderr))\n"
              "concurrent.futures.ThreadPoolExecutor(1).submit(int)  # never shut down: exit must not hang\n"
              "sys.argv = ['ram-studio', *sys.argv[1:]]\n"
              "cli.run()\n"
              "print('not reached')\n")
    repo = REPO_ROOT
    ok = subprocess.run([sys.executable, "-c", script, "analyze", str(base), *map(str, agents), "--quiet",
                         "--no-cache"], capture_output=True, text=True, cwd=repo, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "ε = 1e-05" in ok.stdout and all(f"agent{i}" in ok.stdout for i in range(len(agents)))
    assert "not reached" not in ok.stdout and "atexit handler ran" in ok.stderr
    bad = subprocess.run([sys.executable, "-c", script, "analyze", str(base), str(tmp_path / "missing")],
                         capture_output=True, text=True, cwd=repo, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
    assert "atexit handler ran" in bad.stderr

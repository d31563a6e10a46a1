"""A merge never destroys inputs, never reads or leaks files from outside a model folder, never lets two
writers race, and never writes a wrong model with exit 0. Each test is a row of the "Trust" table in
docs/security.md; inputs are copies, hashed before and after where it matters."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from merging.common.errors import RamStudioError
from merging.writing.commit import commit, rename_no_replace
from merging.writing.placement import FolderTarget
from ram_studio.cli import main
from tests.factory import checksums, join_safetensors, split_safetensors, state

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *argv) -> tuple[int, str, str]:
    """Run the CLI in-process; a failure must be exactly one line `error: …` and never a traceback."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    if code != 0:
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return code, out, err


@pytest.fixture()
def models(family, tmp_path):
    """A private copy of the tiny family under tmp/models (tests may point outputs at it)."""
    base, agents = family
    root = tmp_path / "models"
    copies = [shutil.copytree(p, root / p.name) for p in [base, *agents]]
    return copies[0], copies[1:]


def merge_argv(base, agents, out, *extra):
    return ["merge", base, *agents, "--method", "ram", "--out", out, "--quiet", *extra]


def no_leftovers(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if ".partial-" in p.name or p.name.endswith(".lock")]


# --- 1. input destruction ---------------------------------------------------------------------------

@pytest.mark.parametrize("where,relation", [("parent", "contains"), ("agent", "is"), ("inside", "is inside"),
                                            ("inside-symlink", "is inside")])
def test_output_never_is_contains_or_sits_inside_an_input(capsys, models, tmp_path, where, relation):
    base, agents = models
    before = checksums([base.parent])
    if where == "parent":
        out = base.parent
    elif where == "agent":
        out = agents[0]
    elif where == "inside":
        out = base / "merged"
    else:  # a link elsewhere that resolves into an input folder
        (tmp_path / "link").symlink_to(agents[1])
        out = tmp_path / "link" / "merged"
    for extra in ((), ("--overwrite",)):
        code, _, err = run(capsys, *merge_argv(base, agents, out, *extra))
        assert code == 2 and f" {relation} the input" in err, err
    assert checksums([base.parent]) == before
    assert not (base / "merged").exists()


def test_hub_cache_snapshot_is_protected_as_a_whole(capsys, models, tmp_path):
    """A Hub snapshot's files are links into the repo's blob store: the whole cached repo is an input."""
    base, agents = models
    repo = tmp_path / "hub" / "models--org--agent"
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in agents[0].iterdir():
        blob = repo / "blobs" / f"blob-{f.name}"
        shutil.copyfile(f, blob)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    code, _, err = run(capsys, *merge_argv(base, [snap, agents[1]], repo / "blobs" / "merged"))
    assert code == 2 and "is inside the input" in err
    code, _, err = run(capsys, *merge_argv(base, [snap, agents[1]], tmp_path / "ok"))
    assert code == 0, err  # the snapshot's blob links are read like regular files


def test_analysis_outputs_follow_the_same_rules(capsys, models, tmp_path):
    base, agents = models
    before = checksums([base.parent])
    for flag, path in (("--json", base / "config.json"), ("--csv", agents[0] / "stats.csv")):
        for extra in ((), ("--overwrite",)):
            code, _, err = run(capsys, "analyze", base, *agents, flag, path, "--quiet", *extra)
            assert code == 2 and "the input" in err, err
    assert checksums([base.parent]) == before
    existing = tmp_path / "stats.json"
    existing.write_text("mine")
    code, _, err = run(capsys, "analyze", base, *agents, "--json", existing, "--quiet")
    assert code == 2 and "exists" in err and existing.read_text() == "mine"
    code, _, err = run(capsys, "analyze", base, *agents, "--json", existing, "--quiet", "--overwrite")
    assert code == 0 and json.loads(existing.read_text())["eps"]
    code, _, err = run(capsys, "inspect", base, *agents, "--json", agents[1] / "x.json")
    assert code == 2 and "inside the input" in err


def test_overwrite_replaces_only_a_folder_ram_studio_wrote(capsys, models, tmp_path):
    base, agents = models
    user = tmp_path / "user-folder"
    user.mkdir()
    (user / "notes.txt").write_text("precious")
    code, _, err = run(capsys, *merge_argv(base, agents, user, "--overwrite"))
    assert code == 2 and "refusing to overwrite" in err and (user / "notes.txt").read_text() == "precious"
    ours = tmp_path / "ours"
    assert run(capsys, *merge_argv(base, agents, ours))[0] == 0
    (ours / "notes.txt").write_text("added by hand")  # a merged folder a person has since added to
    code, _, err = run(capsys, *merge_argv(base, agents, ours, "--overwrite"))
    assert code == 2 and "notes.txt" in err and (ours / "notes.txt").exists()
    (ours / "notes.txt").unlink()
    assert run(capsys, *merge_argv(base, agents, ours, "--overwrite"))[0] == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run(capsys, *merge_argv(base, agents, empty))[0] == 0  # an empty folder needs no --overwrite
    no_leftovers(tmp_path)


def test_output_never_goes_inside_another_model_folder(capsys, models, tmp_path):
    """A first `--out merged` and an app default of ./merged/NAME nested one model in another,
    in either order. A model folder (config.json + safetensors, or our recipe) never receives a merge inside."""
    base, agents = models
    cli_made = tmp_path / "merged"
    assert run(capsys, *merge_argv(base, agents, cli_made))[0] == 0
    before = checksums([cli_made])
    for inside in (cli_made / "demo-ram_plus", cli_made / "a" / "b"):
        code, _, err = run(capsys, *merge_argv(base, agents, inside))
        assert code == 2 and "inside the model folder" in err and str(cli_made) in err
    assert checksums([cli_made]) == before and not (cli_made / "a").exists()
    plain = tmp_path / "weights-only"  # someone else's model: config.json next to safetensors
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    (plain / "model.safetensors").write_bytes(b"")
    code, _, err = run(capsys, *merge_argv(base, agents, plain / "sub"))
    assert code == 2 and "inside the model folder" in err


def test_suggested_output_names_are_distinct_and_clean():
    from merging.writing.placement import suggest_output_name

    a = {"base": "/tmp/x/base", "agents": ["a", "b"], "method": "ram_plus", "params": {"r": 0.1}}
    name = suggest_output_name("/tmp/x/base", a)
    assert name.startswith("tmp_x_base-ram_plus-") and "/" not in name and len(name.rsplit("-", 1)[1]) == 8
    assert suggest_output_name("base", a) == suggest_output_name("base", dict(a))  # deterministic
    assert suggest_output_name("base", {**a, "params": {"r": 0.2}}) != suggest_output_name("base", a)
    assert suggest_output_name("base", {**a, "agents": ["b", "a"]}) != suggest_output_name("base", a)
    assert suggest_output_name("../..", a).startswith("model-")


def test_failed_merge_removes_the_parent_folders_it_created(capsys, models, tmp_path):
    base, agents = models
    out = tmp_path / "new" / "deeper" / "merged"
    code, _, err = run(capsys, *merge_argv(base, agents, out, "--eps", "1e9"))  # refused: changes nothing
    assert code == 2 and not (tmp_path / "new").exists()


# --- 2. files from outside a model folder -----------------------------------------------------------

@pytest.mark.parametrize("target", ["outside-file", "proc-environ"])
def test_side_file_links_out_of_the_folder_are_never_copied(capsys, models, tmp_path, target, monkeypatch):
    base, agents = models
    monkeypatch.setenv("RAM_STUDIO_TEST_SECRET", "hf_TOPSECRET_TOKEN")
    secret = tmp_path / "secret.txt"
    secret.write_text("hf_TOPSECRET_TOKEN")
    (base / "tokenizer.json").unlink()
    (base / "tokenizer.json").symlink_to(secret if target == "outside-file" else Path("/proc/self/environ"))
    out = tmp_path / "out"
    code, _, err = run(capsys, *merge_argv(base, agents, out))
    assert code == 2 and "tokenizer.json" in err and "outside the model folder" in err
    assert "TOPSECRET" not in err and not out.exists()
    no_leftovers(tmp_path)


def test_weight_file_links_out_of_the_folder_are_refused(capsys, models, tmp_path):
    base, agents = models
    shard = sorted(agents[0].glob("*.safetensors"))[0]
    moved = tmp_path / "elsewhere.safetensors"
    shard.rename(moved)
    shard.symlink_to(moved)
    code, _, err = run(capsys, "inspect", base, *agents)
    assert code == 2 and "outside the model folder" in err


@pytest.mark.parametrize("name", ["/etc/passwd", "../secret.safetensors", "sub/x.safetensors", "config.json"])
def test_index_may_only_name_shards_inside_the_folder(capsys, models, tmp_path, name):
    base, agents = models
    (base.parent / "secret.safetensors").write_bytes(b"TOPSECRET" * 100)
    index_path = agents[0] / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = name
    index_path.write_text(json.dumps(index))
    code, _, err = run(capsys, "inspect", base, *agents)
    assert code == 2 and "not a plain .safetensors file name" in err, err
    assert "TOPSECRET" not in err and str(int.from_bytes(b"TOPSECRE", "little")) not in err


# --- 3. concurrent writers --------------------------------------------------------------------------

def test_second_writer_fails_fast_naming_the_running_merge(capsys, slow_family, tmp_path):
    base, agents = slow_family
    out = tmp_path / "target"
    cmd = [sys.executable, "-m", "merging", "merge", str(base), *map(str, agents), "--method", "dare_ties",
           "--out", str(out), "--chunk-elems", "2048", "--quiet"]
    first = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        lock = tmp_path / ".target.lock"
        deadline = time.time() + 120
        while not (lock.exists() and lock.stat().st_size) and time.time() < deadline:
            assert first.poll() is None, first.stderr.read()
            time.sleep(0.05)
        start = time.time()
        code, _, err = run(capsys, "merge", base, *agents, "--method", "ram", "--out", out, "--quiet")
        assert code == 2 and "another merge is writing" in err and f"pid {first.pid}" in err, err
        assert time.time() - start < 30  # fails fast, does not wait for the running merge
        _, first_err = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, first_err
    recipe = json.loads((out / "ram_recipe.json").read_text())
    assert recipe["spec"]["method"] == "dare_ties"  # the first writer's result, not replaced
    code, _, err = run(capsys, "merge", base, *agents, "--method", "ram", "--out", out, "--quiet")
    assert code == 2 and "not empty" in err
    no_leftovers(tmp_path)


def test_final_rename_never_replaces_what_appeared_meanwhile(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"new")
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "theirs.txt").write_text("another writer's result")
    with pytest.raises(RamStudioError, match="appeared while this merge was running"):
        rename_no_replace(src, dst)
    empty = tmp_path / "empty-appeared"
    empty.mkdir()
    with pytest.raises(RamStudioError, match="appeared"):
        commit(src, FolderTarget(empty, replaces=None))  # it did not exist when the merge was checked
    assert (dst / "theirs.txt").read_text() == "another writer's result" and empty.is_dir()


# --- 4. wrong models with exit 0 --------------------------------------------------------------------

@pytest.mark.parametrize("extra,fragment", [
    (("--method", "task_arithmetic", "--lambda", "1e39"), "lambda"),
    (("--method", "ram_plus", "--r", "1e39"), "r=1e+39"),
    (("--method", "ram_plus", "--r", "1e37", "--alpha", "1000"), "largest λ_t"),
    (("--method", "dare_ta", "--drop-rate", "0.9999999999"), "1/(1−p)"),
])
def test_parameters_that_overflow_float32_are_refused_before_any_work(capsys, family, tmp_path, extra, fragment):
    base, agents = family
    out = tmp_path / "out"
    code, _, err = run(capsys, "merge", base, *agents, "--out", out, "--quiet", *extra)
    assert code == 2 and fragment in err and "float32" in err and not out.exists(), err


def test_non_finite_result_aborts_naming_tensor_index_and_parameter(capsys, family, tmp_path):
    base, agents = family
    out = tmp_path / "out"
    code, _, err = run(capsys, "merge", base, *agents, "--method", "task_arithmetic", "--lambda", "1e7",
                       "--out-dtype", "float16", "--out", out, "--quiet")
    assert code == 2 and "is not finite" in err and "flat index" in err and "lambda=1e+07" in err, err
    assert "model." in err and not out.exists()
    no_leftovers(tmp_path)


@pytest.mark.parametrize("extra", [("--method", "ram", "--eps", "1e9"),
                                   ("--method", "ties", "--density", "1e-9"),
                                   ("--method", "dare_ta", "--drop-rate", "0.99999999")])
def test_merge_that_changes_nothing_is_refused_unless_allowed(capsys, family, tmp_path, extra):
    base, agents = family
    out = tmp_path / "noop"
    code, _, err = run(capsys, "merge", base, *agents, "--out", out, "--quiet", *extra)
    if "1/(1−p)" in err:  # p rounds to 1 in float32: refused even earlier, as an invalid factor
        return
    assert code == 2 and "changes nothing" in err and "--allow-noop" in err and not out.exists(), err
    code, _, err = run(capsys, "merge", base, *agents, "--out", out, "--quiet", "--allow-noop", *extra)
    assert code == 0 and "WARNING" in err
    assert "changes nothing" in (out / "README.md").read_text()


def test_byte_identical_agent_under_another_path_is_refused(capsys, models, tmp_path):
    base, agents = models
    twin = shutil.copytree(agents[0], tmp_path / "twin")
    for argv in (merge_argv(base, [agents[0], twin], tmp_path / "out"),
                 ["analyze", base, agents[0], twin, "--quiet"]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "same weights as agent" in err, err
    assert not (tmp_path / "out").exists()


def test_fp32_agent_with_smaller_vocabulary_is_taken_at_full_precision(capsys, family, tmp_path):
    """τ comes from the stored float32 values even where the rows are padded with a bf16 base's."""
    from merging.engine.tensor_merge import merge_in_memory

    base, agents = family
    b = state(base)
    g = torch.Generator().manual_seed(7)
    small = {}
    for name, t in b.items():
        v = t.float() + torch.randn(t.shape, generator=g) * 1e-3  # values bf16 cannot hold
        small[name] = v[:-2].contiguous() if "embed_tokens" in name or "lm_head" in name else v
    agent = tmp_path / "fp32-small-vocab"
    agent.mkdir()
    save_file(small, agent / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(base / "config.json", agent / "config.json")
    out = tmp_path / "out"
    code, _, err = run(capsys, "merge", base, agents[0], agent, "--method", "task_arithmetic", "--on-mismatch",
                       "base", "--out-dtype", "float32", "--out", out, "--quiet")
    assert code == 0, err
    name = "model.embed_tokens.weight"
    a0 = state(agents[0])[name].float()
    a1 = torch.cat([small[name], b[name][-2:].float()])
    expect = b[name].float() + merge_in_memory("task_arithmetic", torch.stack([a0 - b[name].float(),
                                                                                a1 - b[name].float()]))
    assert torch.equal(load_file(out / "model.safetensors")[name], expect)


def _renamed(src: Path, dst: Path, rename) -> Path:
    dst.mkdir()
    save_file({rename(k): v for k, v in state(src).items()}, dst / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(src / "config.json", dst / "config.json")
    return dst


@pytest.mark.parametrize("rename,hint", [
    (lambda k: k.removeprefix("model."), "'model.' prefix"),
    (lambda k: "base_model.model." + k, "PEFT"),
])
def test_mismatch_policy_cannot_hide_losing_an_agent(capsys, family, tmp_path, rename, hint):
    base, agents = family
    odd = _renamed(agents[1], tmp_path / "odd", rename)
    out = tmp_path / "out"
    for policy in ("error", "base"):
        code, _, err = run(capsys, *merge_argv(base, [agents[0], odd], out, "--on-mismatch", policy))
        assert code == 2 and hint in err, err
    code, _, err = run(capsys, *merge_argv(base, [agents[0], odd], out, "--on-mismatch", "base"))
    share = float(err.split("would drop ")[1].split(" %")[0])
    assert share > 80 and "of agent odd" in err and not out.exists()  # lm_head keeps its name: not 100 %


def test_fused_moe_experts_get_a_hint(capsys, tmp_path):
    def moe(folder: Path, fused: bool, seed: int) -> Path:
        folder.mkdir()
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(2, 8, 4, generator=g).to(torch.bfloat16)
        t = {"model.layers.0.mlp.experts.up_proj": w} if fused else {
            f"model.layers.0.mlp.experts.{i}.up_proj.weight": w[i].contiguous() for i in range(2)}
        t["model.norm.weight"] = torch.ones(4, dtype=torch.bfloat16) + seed
        save_file(t, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"]}))
        return folder

    base, a, fused = moe(tmp_path / "b", False, 0), moe(tmp_path / "a", False, 1), moe(tmp_path / "f", True, 2)
    code, _, err = run(capsys, *merge_argv(base, [a, fused], tmp_path / "out", "--on-mismatch", "base"))
    assert code == 2 and "MoE experts" in err, err


def test_lora_adapter_is_named_as_an_adapter(capsys, family, tmp_path):
    base, agents = family
    adapter = tmp_path / "my-lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(8, 32)},
              adapter / "adapter_model.safetensors")
    for argv in (["inspect", base, agents[0], adapter], merge_argv(base, [agents[0], adapter], tmp_path / "o")):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "LoRA/PEFT adapter" in err and "merge_and_unload" in err, err


# --- 5. recipes ---------------------------------------------------------------------------------------

def test_run_refuses_inputs_whose_content_changed(capsys, models, tmp_path):
    base, agents = models
    out = tmp_path / "first"
    assert run(capsys, *merge_argv(base, agents, out))[0] == 0
    recipe = json.loads((out / "ram_recipe.json").read_text())
    headers = {f["header_sha256"] for i in recipe["inputs"] for f in i["files"]}
    assert len(headers) < sum(len(i["files"]) for i in recipe["inputs"])  # same layout ⇒ same header hash
    assert len({i["weights_xxh3_128"] for i in recipe["inputs"]}) == 4  # the content fingerprints differ
    # Change one weight in place: same shapes, same header bytes, different content.
    shard = sorted(agents[1].glob("*.safetensors"))[0]
    raw = bytearray(shard.read_bytes())
    raw[-2] ^= 0x01
    shard.write_bytes(bytes(raw))
    code, _, err = run(capsys, "run", out / "ram_recipe.json", "--out", tmp_path / "again", "--quiet")
    assert code == 2 and "has changed since the recipe was written" in err and shard.name in err, err
    assert not (tmp_path / "again").exists()
    code, _, err = run(capsys, "run", out / "ram_recipe.json", "--out", tmp_path / "again", "--quiet",
                       "--allow-changed-inputs")
    assert code == 0, err


def test_run_refuses_a_changed_header_before_any_work(capsys, models, tmp_path, monkeypatch):
    """Sizes and header hashes are compared before anything is read; contents once they are read."""
    import merging.merge as export

    base, agents = models
    out = tmp_path / "first"
    assert run(capsys, *merge_argv(base, agents, out))[0] == 0
    shard = sorted(agents[0].glob("*.safetensors"))[0]
    header, data = split_safetensors(shard)
    header["__metadata__"] = {"format": "pt", "note": "edited"}
    join_safetensors(shard, header, data)
    monkeypatch.setattr(export, "stream_merge", lambda *a, **k: pytest.fail("the merge started"))
    code, _, err = run(capsys, "run", out / "ram_recipe.json", "--out", tmp_path / "again", "--quiet")
    assert code == 2 and f"{shard.name} has changed" in err and not (tmp_path / "again").exists()


@pytest.mark.parametrize("edit,fragment", [
    (lambda s: s.update(out_dtype="I8"), "out_dtype"),
    (lambda s: s.update(shard_size=0), "must be positive"),
    (lambda s: s.update(shard_size=True), "shard_size"),
    (lambda s: s["params"].update(eps="abc"), "eps="),
    (lambda s: s["params"].update(eps=True), "eps="),
    (lambda s: s.update(agents="demo:code"), "agents"),
    (lambda s: s.update(chunk_elems=0), "chunk_elems"),
    (lambda s: s.update(device="tpu"), "device"),
    (lambda s: s.update(method=["ram"]), "method"),
    (lambda s: s.update(on_mismatch="ignore"), "on_mismatch"),
    (lambda s: s.update(extra=1), "unknown fields"),
])
def test_tampered_recipe_is_one_clear_line(capsys, family, tmp_path, edit, fragment):
    base, agents = family
    out = tmp_path / "m"
    assert run(capsys, *merge_argv(base, agents, out))[0] == 0
    doc = json.loads((out / "ram_recipe.json").read_text())
    edit(doc["spec"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, _, err = run(capsys, "run", bad, "--out", tmp_path / "r", "--quiet")
    assert code == 2 and fragment in err and not (tmp_path / "r").exists(), err


# --- 6. no traceback, ever ------------------------------------------------------------------------------

@pytest.mark.parametrize("content,fragment",
                         [("[1, 2]", "JSON list"), ('"qwen2"', "JSON str"), ("{", "not valid JSON")])
def test_config_that_is_not_an_object(capsys, models, content, fragment):
    base, agents = models
    (agents[0] / "config.json").write_text(content)
    for argv in (["inspect", base, *agents], ["analyze", base, *agents, "--quiet"]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and fragment in err and "config.json" in err, err


def _rewrite(shard: Path, edit_header, tail: bytes = b"", gap: int = 0) -> None:
    header, data = split_safetensors(shard)
    edit_header(header)
    join_safetensors(shard, header, b"\0" * gap + data + tail)


def _first(h):
    return next(k for k in h if k != "__metadata__")


def _shift_all(h, by):
    for k, v in h.items():
        if k != "__metadata__":
            v["data_offsets"] = [o + by for o in v["data_offsets"]]


@pytest.mark.parametrize("case,edit,tail,gap,fragment", [
    ("trailing bytes", lambda h: None, b"\0" * 16, 0, "bytes after its last tensor"),
    ("gap before data", lambda h: _shift_all(h, 8), b"", 8, "gap of 8 bytes"),
    ("non-string metadata", lambda h: h.update({"__metadata__": {"format": 1}}), b"", 0, "__metadata__"),
    ("boolean dimension", lambda h: h[_first(h)].update(shape=[True] * len(h[_first(h)]["shape"])), b"", 0,
     "invalid shape"),
    ("2^64 dimension", lambda h: h[_first(h)].update(shape=[2 ** 64, 0]), b"", 0, "invalid shape"),
])
def test_malformed_safetensors_are_refused_by_inspect_and_merge(capsys, models, tmp_path, case, edit, tail, gap,
                                                                fragment):
    base, agents = models
    shard = sorted(agents[1].glob("*.safetensors"))[0]
    _rewrite(shard, edit, tail, gap)
    for argv in (["inspect", base, *agents], merge_argv(base, agents, tmp_path / "out")):
        code, _, err = run(capsys, *argv)
        assert code == 2 and fragment in err and shard.name in err, (case, err)


class _Trap:
    """Unpickling this creates a marker file: proof that something was unpickled."""

    marker = ""

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_evaluate_never_unpickles(capsys, tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    marker = tmp_path / "UNPICKLED"
    trap = _Trap()
    trap.marker = str(marker)
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(trap))
    code, _, err = run(capsys, "evaluate", folder, "--limit", "1")
    assert code == 2 and "pickle" in err and not marker.exists()


def test_control_characters_in_names_are_escaped(capsys, tmp_path):
    names = ["model.\x1b[31mred\x1b[0m.weight", "model.\u202eevil.weight"]
    folders = []
    for i in range(3):
        f = tmp_path / f"m{i}"
        f.mkdir()
        save_file({n: torch.full((4,), float(i + j)) for j, n in enumerate(names)}, f / "model.safetensors")
        (f / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
        folders.append(f)
    save_file({names[1]: torch.zeros(4)}, folders[2] / "model.safetensors")  # the mismatch names the ESC tensor
    code, out, err = run(capsys, "inspect", *folders)
    assert code == 2 and "\\x1b" in out + err and "\x1b" not in err + out and "\u202e" not in err + out, err
    code, out, err = run(capsys, "inspect", *folders[:2], folders[1].parent / "m0")
    assert "\x1b" not in out + err


# === Trust v2: each class of the hostile pass, and the attacks on its fix ====================

def _dead_pid() -> int:
    """The id of a process that has exited (for lock files and markers that name a dead writer)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _unshare(script: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a shell `script` in a private mount namespace (mounts vanish with it): bind mounts and mount points
    without touching the machine's. Skips when the kernel or the sandbox does not allow it."""
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("user and mount namespaces are not available here (unshare)")
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _cli(*argv) -> str:
    import shlex

    return " ".join(shlex.quote(str(a)) for a in [sys.executable, "-m", "ram_studio", *argv])


def _cache_layout(root: Path, model: Path, links: dict[str, str], blobs_to: Path | None = None) -> Path:
    """A Hugging Face cache entry `root/models--org--x` whose snapshot holds `model`'s files as regular files,
    plus links named in `links` (name -> link target); `blobs` is a link to `blobs_to` when given."""
    repo = root / "models--org--x"
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    if blobs_to is not None:
        (repo / "blobs").symlink_to(blobs_to)
    else:
        (repo / "blobs").mkdir()
    for f in model.iterdir():
        if f.name not in links:
            shutil.copyfile(f, snap / f.name)
    for name, target in links.items():
        (snap / name).symlink_to(target)
    return snap


# --- 1. a cache layout that reads anything --------------------------------------------------------------

def test_blob_store_that_is_a_link_reads_nothing(capsys, models, tmp_path, monkeypatch):
    """`blobs -> /` made every file of the disk a "blob"; the process environment (HF_TOKEN) and
    any readable file were copied into the output. The blob store must be a real folder of the repo."""
    base, agents = models
    monkeypatch.setenv("HF_TOKEN", "hf_TOPSECRET_TOKEN")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    snap = _cache_layout(tmp_path / "extracted", base, {
        "tokenizer.json": "../../blobs/proc/self/environ",
        "vocab.txt": "../../blobs/" + str(secret).lstrip("/")}, blobs_to=Path("/"))
    out = tmp_path / "out"
    for argv in (merge_argv(snap, agents, out), merge_argv(base, [snap, agents[1]], out), ["inspect", snap, *agents]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "blob store" in err and "is a link" in err, err
        assert "TOPSECRET" not in err and not out.exists()
    no_leftovers(tmp_path)


def test_a_snapshot_folder_linked_out_of_its_repo_is_refused(capsys, models, tmp_path):
    """The root may not be a link: a snapshot folder of a cache entry that links elsewhere —
    e.g. to a folder holding secrets next to model files — is refused; one linking inside its repo is fine."""
    base, agents = models
    repo = tmp_path / "hub" / "models--org--x"
    (repo / "snapshots").mkdir(parents=True)
    (repo / "blobs").mkdir()
    elsewhere = shutil.copytree(base, tmp_path / "elsewhere")
    (repo / "snapshots" / "rev").symlink_to(elsewhere)
    code, _, err = run(capsys, "inspect", repo / "snapshots" / "rev", *agents)
    assert code == 2 and "links to" in err and "outside its repo" in err, err
    inside = shutil.copytree(base, repo / "snapshots" / "real")
    (repo / "snapshots" / "alias").symlink_to(inside)
    code, _, err = run(capsys, "inspect", repo / "snapshots" / "alias", *agents)
    assert code == 0, err


def test_hard_links_bring_nothing_in(capsys, models, tmp_path):
    """A side file or a blob hard-linked to a file outside was copied. A file with more than one
    link is read only when it is a blob of the repo's own store whose content matches its name."""
    import hashlib

    base, agents = models
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    os.link(secret, base / "vocab.txt")  # a plain folder: a hard link to a file outside
    out = tmp_path / "out"
    code, _, err = run(capsys, *merge_argv(base, agents, out))
    assert code == 2 and "vocab.txt" in err and "hard link" in err and not out.exists(), err
    (base / "vocab.txt").unlink()
    shard = sorted(agents[0].glob("*.safetensors"))[0]  # a weight file hard-linked from elsewhere
    os.link(shard, tmp_path / "elsewhere.safetensors")
    code, _, err = run(capsys, "inspect", base, *agents)
    assert code == 2 and "hard link" in err, err
    (tmp_path / "elsewhere.safetensors").unlink()
    # In a cache layout: a blob named by its own sha256 is the file the Hub gave, whatever links it has;
    # a blob whose content does not match its name is not.
    good = b'{"version": "1.0"}'
    snap = _cache_layout(tmp_path / "hub", base, {})
    blobs = snap.parent.parent / "blobs"
    (blobs / hashlib.sha256(good).hexdigest()).write_bytes(good)
    os.link(blobs / hashlib.sha256(good).hexdigest(), tmp_path / "dedup-copy")
    (snap / "tokenizer.json").unlink()
    (snap / "tokenizer.json").symlink_to(f"../../blobs/{hashlib.sha256(good).hexdigest()}")
    code, _, err = run(capsys, *merge_argv(snap, agents, out))
    assert code == 0 and (out / "tokenizer.json").read_bytes() == good, err
    forged = blobs / ("0" * 64)
    os.link(secret, forged)
    (snap / "vocab.txt").symlink_to(f"../../blobs/{forged.name}")
    code, _, err = run(capsys, *merge_argv(snap, agents, tmp_path / "out2"))
    assert code == 2 and "vocab.txt" in err and "hard link" in err and "TOPSECRET" not in err, err


@pytest.mark.parametrize("kind", ["fifo", "link-out", "too-large"])
def test_side_files_are_checked_before_any_work(capsys, models, tmp_path, monkeypatch, kind):
    """A side file that may not be copied (a FIFO, a link out, an oversized file) was found only
    after the whole merge ran. It is refused before any tensor is read."""
    import merging.merge as export
    import merging.writing.side_files as side_files

    base, agents = models
    target = base / "chat_template.jinja"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "link-out":
        (tmp_path / "outside.jinja").write_text("{{ secret }}")
        target.symlink_to(tmp_path / "outside.jinja")
    else:
        monkeypatch.setattr(side_files, "MAX_SIDE_FILE", 4)
        target.write_text("more than four bytes")
    monkeypatch.setattr(export, "stream_merge", lambda *a, **k: pytest.fail("the merge started"))
    monkeypatch.setattr(export, "count_overlaps", lambda *a, **k: pytest.fail("the merge started"))
    code, _, err = run(capsys, *merge_argv(base, agents, tmp_path / "out"))
    assert code == 2 and "chat_template.jinja" in err, err
    assert {"fifo": "not a regular file", "link-out": "outside the model folder", "too-large": "bytes"}[kind] in err


def test_merge_options_as_one_object_or_as_keywords(models, tmp_path):
    """merge_to_folder takes its options as a MergeOptions or as its fields by keyword: the same merge either
    way; an unknown keyword, or both forms at once, is a TypeError (never silently ignored)."""
    from merging.merge import MergeOptions, merge_to_folder
    from merging.recipe import MergeSpec

    base, agents = models

    def spec(name: str) -> MergeSpec:
        return MergeSpec(str(base), [str(a) for a in agents], "ram_plus", out=str(tmp_path / name))

    seen: list[str] = []
    by_keywords = merge_to_folder(spec("kw"), allow_noop=False, provenance={"source": "test"})
    by_object = merge_to_folder(spec("obj"), MergeOptions(provenance={"source": "test"}, warn=seen.append))
    assert (by_keywords.out / "model.safetensors").read_bytes() == (by_object.out / "model.safetensors").read_bytes()
    assert by_keywords.lambdas == by_object.lambdas and by_keywords.lambdas
    assert json.loads((by_object.out / "ram_recipe.json").read_text())["source"] == "test"
    with pytest.raises(TypeError):
        merge_to_folder(spec("typo"), overwrit=True)
    with pytest.raises(TypeError):
        merge_to_folder(spec("both"), MergeOptions(), overwrite=True)
    assert not (tmp_path / "typo").exists() and not (tmp_path / "both").exists() and seen == []


def test_downloads_read_what_the_merge_wrote_never_the_path_again(models, tmp_path):
    """The app's zip was built at click time from whatever the output path named then (a folder
    swapped for a link zipped the link's target). Downloads and uploads read the files the merge committed
    (same folder, inode and size; SHA-256 for small outputs) or refuse."""
    import io
    import zipfile

    from merging.merge import merge_to_folder
    from merging.recipe import MergeSpec
    from merging.writing.written import read_bytes, zip_bytes

    base, agents = models
    out = tmp_path / "merged"
    res = merge_to_folder(MergeSpec(str(base), [str(a) for a in agents], "ram", out=str(out)))
    wf = res.written
    names = sorted(p.name for p in out.iterdir())
    assert [f.name for f in wf.files] == names and all(f.sha256 for f in wf.files)
    with zipfile.ZipFile(io.BytesIO(zip_bytes(wf))) as z:
        assert sorted(z.namelist()) == [f"merged/{n}" for n in names]
        assert all(z.read(f"merged/{n}") == (out / n).read_bytes() for n in names)
    # The folder swapped for a link to another folder (with the same file names).
    other = tmp_path / "other"
    shutil.copytree(out, other)
    (other / "README.md").write_text("someone else's files")
    out.rename(tmp_path / "moved")
    out.symlink_to(other)
    for read in (lambda: zip_bytes(wf), lambda: read_bytes(wf, "README.md")):
        with pytest.raises(RamStudioError, match="no longer what the merge wrote"):
            read()
    out.unlink()
    (tmp_path / "moved").rename(out)
    # A file replaced in place (same name and size, other content; or another inode).
    card = (out / "README.md").read_bytes()
    with open(out / "README.md", "r+b") as f:
        f.write(b"X")
    with pytest.raises(RamStudioError, match="no longer what the merge wrote"):
        read_bytes(wf, "README.md")
    (out / "README.md").unlink()  # another file under the name (its inode may even be reused): other bytes
    (out / "README.md").write_bytes(card.replace(b"ram", b"RAM", 1))
    with pytest.raises(RamStudioError, match="no longer what the merge wrote"):
        zip_bytes(wf)
    assert read_bytes(wf, "ram_recipe.json") == (out / "ram_recipe.json").read_bytes()


# --- 2. nothing deleted that is not provably ours -------------------------------------------------------

def test_an_input_that_looks_like_a_stale_partial_is_never_deleted(capsys, models, tmp_path):
    """An input named like a stale partial output next to the target was removed by the clean-up.
    Only a leftover holding our marker, naming this target, host and a dead process, and holding no input, goes."""
    import socket

    from merging.writing.commit import PARTIAL_MARKER

    base, agents = models
    dead = _dead_pid()
    lookalike = shutil.copytree(agents[0], tmp_path / f".merged.partial-aaaaaaaa-{dead}")
    before = checksums([lookalike])
    host_of_input = tmp_path / f".merged.partial-bbbbbbbb-{dead}"  # forged marker, but it holds an input
    inner = shutil.copytree(agents[1], host_of_input / "agent")
    (host_of_input / PARTIAL_MARKER).write_text(json.dumps({"pid": dead, "host": socket.gethostname(),
                                                            "target": "merged"}))
    ours = tmp_path / f".merged.partial-cccccccc-{dead}"  # a real leftover of ours
    ours.mkdir()
    (ours / PARTIAL_MARKER).write_text(json.dumps({"pid": dead, "host": socket.gethostname(), "target": "merged"}))
    (ours / "model.safetensors").write_bytes(b"half")
    code, _, err = run(capsys, *merge_argv(base, [lookalike, inner], tmp_path / "merged"))
    assert code == 0, err
    assert checksums([lookalike]) == before and inner.is_dir() and not ours.exists()
    assert not (tmp_path / "merged" / PARTIAL_MARKER).exists()


# --- 3. outputs inside inputs without a symlink ---------------------------------------------------------

def test_outputs_through_a_bind_mount_of_an_input_are_refused(models, tmp_path):
    """A bind mount of an input (other path string, same device and inode) let an output, an
    `inspect --json` and an analysis file land inside the input."""
    base, agents = models
    view, above = tmp_path / "view", tmp_path / "above"
    view.mkdir()
    above.mkdir()
    before = checksums([base.parent])
    script = (f"mount --bind {agents[0]} {view} && mount --bind {base.parent} {above} && "
              f"{_cli('merge', base, *agents, '--method', 'ram', '--out', view / 'merged', '--quiet')}; "
              f"echo \"rc=$?\"; "
              f"{_cli('merge', base, *agents, '--method', 'ram', '--out', above, '--quiet', '--overwrite')}; "
              f"echo \"rc=$?\"; "
              f"{_cli('inspect', base, *agents, '--json', view / 'report.json')}; echo \"rc=$?\"; "
              f"{_cli('analyze', base, *agents, '--csv', view / 'stats.csv', '--quiet')}; echo \"rc=$?\"")
    proc = _unshare(script)
    assert proc.stdout.count("rc=2") == 4, (proc.stdout, proc.stderr)
    assert proc.stderr.count("is inside the input") == 3 and proc.stderr.count("contains the input") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert checksums([base.parent]) == before and not (agents[0] / "merged").exists()


def test_an_empty_mount_point_is_refused_before_any_work(models, tmp_path):
    """An output that is an empty mount point failed only at the final rename."""
    base, agents = models
    out = tmp_path / "mnt"
    out.mkdir()
    proc = _unshare(f"mount -t tmpfs none {out} && "
                    f"{_cli('merge', base, *agents, '--method', 'ram', '--out', out, '--quiet')}")
    assert proc.returncode == 2 and "is a mount point" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder owned by another user")
def test_a_folder_owned_by_another_user_is_never_replaced(capsys, models, tmp_path):
    """An empty world-writable (1777) folder owned by another user was silently replaced."""
    base, agents = models
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    os.chown(shared, 65534, 65534)
    for extra in ((), ("--overwrite",)):
        code, _, err = run(capsys, *merge_argv(base, agents, shared, *extra))
        assert code == 2 and "belongs to another user" in err, err
    assert shared.is_dir() and os.stat(shared).st_uid == 65534 and not any(shared.iterdir())


@pytest.mark.parametrize("where", ["is", "inside"])
def test_the_analysis_cache_is_never_written_into_an_input(capsys, models, monkeypatch, where):
    """RAM_STUDIO_CACHE pointing at an input folder wrote the analysis cache into it."""
    base, agents = models
    before = checksums([base.parent])
    monkeypatch.setenv("RAM_STUDIO_CACHE", str(agents[1] if where == "is" else agents[1] / "cache"))
    code, _, err = run(capsys, "analyze", base, *agents, "--quiet")
    assert code == 2 and "analysis cache folder" in err and "RAM_STUDIO_CACHE" in err, err
    assert checksums([base.parent]) == before
    code, _, err = run(capsys, "analyze", base, *agents, "--quiet", "--no-cache")  # no cache: nothing written there
    assert code == 0, err


@pytest.mark.parametrize("name", ["/tmp/elsewhere", "../up", "a/b", "..", "x\x1b]0;title\x07"])
def test_a_recipe_writes_only_into_a_plain_name(capsys, models, tmp_path, monkeypatch, name):
    """A recipe whose recorded output name was absolute or had `../` wrote there instead of ./NAME."""
    base, agents = models
    out = tmp_path / "m"
    assert run(capsys, *merge_argv(base, agents, out))[0] == 0
    doc = json.loads((out / "ram_recipe.json").read_text())
    doc["spec"]["out"] = name
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, _, err = run(capsys, "run", bad, "--quiet")
    assert code == 2 and "not a plain folder name" in err and "--out" in err and "\x1b" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "m", "models", "work"] and not any(work.iterdir())
    code, _, err = run(capsys, "run", bad, "--quiet", "--out", work / "given")  # --out still works
    assert code == 0, err


def test_an_output_in_the_hub_cache_is_allowed_only_outside_inputs_with_a_warning(capsys, models, tmp_path,
                                                                                  monkeypatch):
    """An output in the Hub cache outside every input's repo was accepted silently."""
    from tests.app_helpers import reload_hub_client

    base, agents = models
    cache = tmp_path / "hf-cache"
    (cache / "models--org--other").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    reload_hub_client()
    try:
        for out in (cache / "merged", cache / "models--org--other" / "merged"):
            code, _, err = run(capsys, *merge_argv(base, agents, out))
            assert code == 0 and "warning:" in err and "inside the Hugging Face cache" in err, err
    finally:
        monkeypatch.undo()
        reload_hub_client()


# --- 4. text from files is data --------------------------------------------------------------------------

def test_terminal_lines_escape_paths_and_names(capsys, models, tmp_path):
    """The "wrote …" line printed raw escape sequences from --out (window title set, screen
    cleared); every line the CLI prints is escaped."""
    base, agents = models
    out = tmp_path / "m\x1b]0;pwned\x07\x1b[2J\u202eevil"
    code, stdout, err = main_capture(capsys, *merge_argv(base, agents, out))
    assert code == 0, err
    assert "\x1b" not in stdout + err and "\x07" not in stdout + err and "\u202e" not in stdout + err
    assert "\\x1b]0;pwned\\x07" in stdout and "\\u202e" in stdout
    code, stdout, err = main_capture(capsys, "run", out / "ram_recipe.json", "--out", str(out) + "-again", "--quiet")
    assert code == 0 and "\x1b" not in stdout + err, err


def main_capture(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


HOSTILE_TENSORS = ['=HYPERLINK("http://evil.example/x","click")', "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)",
                   "\tlead", "model.bidi\u202eevil.weight", "![x](http://127.0.0.2:9/b.png) [Click to fix](http://x)"]


def _hostile_family(root: Path, names=HOSTILE_TENSORS, dtype=torch.float32) -> list[Path]:
    g = torch.Generator().manual_seed(3)
    base = {n: torch.randn(64, generator=g) for n in names}
    folders = []
    for i in range(3):
        f = root / f"m{i}"
        f.mkdir(parents=True)
        t = base if i == 0 else {n: v + torch.randn(64, generator=g) * (torch.rand(64, generator=g) < 0.5)
                                 for n, v in base.items()}
        save_file({n: v.to(dtype) for n, v in t.items()}, f / "model.safetensors", metadata={"format": "pt"})
        (f / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
        folders.append(f)
    return folders


def test_csv_cells_never_run_as_formulas(capsys, tmp_path):
    """Tensor names starting with = + - @ were written raw into CSV (formula injection), and
    bidi characters raw."""
    import csv

    folders = _hostile_family(tmp_path)
    out = tmp_path / "stats.csv"
    code, _, err = run(capsys, "analyze", *folders, "--csv", out, "--quiet")
    assert code == 0, err
    text = out.read_text()
    assert "\u202e" not in text and "\\u202e" in text
    rows = list(csv.DictReader(text.splitlines()))
    tensors = {r["tensor"] for r in rows}
    assert len(tensors) == len(HOSTILE_TENSORS)
    for cell in tensors:
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
    assert "'=HYPERLINK(\"http://evil.example/x\",\"click\")" in tensors and "'-2+3" in tensors
    assert all(not r["agent"].startswith(("=", "+", "-", "@")) for r in rows)


# --- 5. nested and aliased data, lists longer than a merge takes ----------------------------------------

def test_a_recipe_with_a_million_agents_is_refused_before_anything_is_opened(capsys, models, tmp_path, monkeypatch):
    """A recipe with 10^5 agents was refused after 145 s (quadratic); one with 10^6 (14.9 MB, under
    the size cap) ran for 25 minutes. The agent count is checked first, before any model is looked at."""
    import merging.reading.checkpoint as checkpoint
    import merging.reading.refs as refs

    base, agents = models
    out = tmp_path / "m"
    assert run(capsys, *merge_argv(base, agents, out))[0] == 0
    doc = json.loads((out / "ram_recipe.json").read_text())
    monkeypatch.setattr(checkpoint, "open_checkpoint", lambda *a, **k: pytest.fail("a model was opened"))
    monkeypatch.setattr(refs, "parse_ref", lambda *a, **k: pytest.fail("a reference was parsed"))
    for n in (100_000, 1_000_000):
        doc["spec"]["agents"] = [f"m/{i}" for i in range(n)]
        bad = tmp_path / f"r{n}.json"
        bad.write_text(json.dumps(doc))
        assert bad.stat().st_size < 16 << 20
        code, _, err = run(capsys, "run", bad, "--out", tmp_path / "x", "--quiet")
        assert code == 2 and f"{n:,} agents given" in err and "at most 64" in err, err
    code, _, err = run(capsys, "merge", base, *[agents[0]] * 65, "--method", "ram", "--out", tmp_path / "y")
    assert code == 2 and "at most 64" in err


# --- 6. every float dtype we write is checked ------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"])
def test_every_written_dtype_is_checked_finite_and_changed(capsys, tmp_path, dtype):
    """The finite and "changed" checks skipped F8_E4M3/F8_E5M2: `--lambda 1e6` wrote Inf with
    exit 0, a real fp8 merge was refused as "changes nothing", and --allow-noop died with KeyError after writing."""
    from merging.common.dtypes import ST_TO_TORCH

    folders = _hostile_family(tmp_path / "in", names=["model.layers.0.mlp.up_proj.weight", "model.norm.weight"],
                              dtype=ST_TO_TORCH[dtype])
    out = tmp_path / "out"
    code, _, err = run(capsys, "merge", *folders, "--method", "task_arithmetic", "--lambda", "3e38", "--out", out,
                       "--quiet")
    assert code == 2 and ("is not finite" in err or "is beyond" in err) and not out.exists(), err
    code, _, err = run(capsys, "merge", *folders, "--method", "task_arithmetic", "--out", out, "--quiet")
    assert code == 0, err  # a real change is seen as one
    merged = load_file(out / "model.safetensors")
    assert all(t.dtype == ST_TO_TORCH[dtype] and bool(torch.isfinite(t.float()).all()) for t in merged.values())
    code, _, err = run(capsys, "merge", *folders, "--method", "ram", "--eps", "1e9", "--out", tmp_path / "noop",
                       "--quiet")
    assert code == 2 and "changes nothing" in err, err
    code, _, err = run(capsys, "merge", *folders, "--method", "ram", "--eps", "1e9", "--out", tmp_path / "noop",
                       "--quiet", "--allow-noop")
    assert code == 0 and "WARNING" in err and (tmp_path / "noop" / "README.md").exists(), err


def test_agents_that_cancel_give_no_merge_only_rounding(capsys, tmp_path):
    """Two agents that differ only in sign gave a model 1e-7 away from the base, accepted as a
    real merge. A merge whose largest change is one step of the output dtype is refused like a no-op."""
    g = torch.Generator().manual_seed(0)
    base = {"model.layers.0.mlp.up_proj.weight": torch.randn(256, generator=g) * 0.02}
    tau = {k: torch.randn(v.shape, generator=g) * 1e-3 for k, v in base.items()}
    folders = []
    for name, sign in (("base", 0), ("plus", 1), ("minus", -1)):
        f = tmp_path / name
        f.mkdir()
        save_file({k: v + sign * tau[k] for k, v in base.items()}, f / "model.safetensors")
        (f / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
        folders.append(f)
    out = tmp_path / "out"
    code, _, err = run(capsys, "merge", *folders, "--method", "task_arithmetic", "--out", out, "--quiet")
    assert code == 2 and "only by float32 rounding" in err and not out.exists(), err
    code, _, err = run(capsys, "merge", *folders, "--method", "task_arithmetic", "--out", out, "--quiet",
                       "--allow-noop")
    assert code == 0 and "WARNING" in err and "rounding" in (out / "README.md").read_text()


# --- 8. rough edges answered before work ---------------------------------------------------------------

def test_an_orphan_cache_file_of_a_killed_writer_is_removed(capsys, models, tmp_path, monkeypatch):
    """An orphan `.KEY.*.tmp` stayed in the analysis cache after a kill. The next writer removes
    ours (this host, a dead writer); nothing else."""
    from analysis.cache import host_name

    base, agents = models
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("RAM_STUDIO_CACHE", str(cache))
    dead = _dead_pid()
    ours = cache / f".{'a' * 32}.{host_name()}.{dead}.0123abcd.tmp"
    other_host = cache / f".{'a' * 32}.elsewhere.{dead}.0123abcd.tmp"
    alive = cache / f".{'a' * 32}.{host_name()}.{os.getppid()}.0123abcd.tmp"
    unknown = cache / ".notes.tmp"
    for p in (ours, other_host, alive, unknown):
        p.write_text("{")
    code, _, err = run(capsys, "analyze", base, *agents, "--quiet")
    assert code == 0, err
    assert not ours.exists() and other_host.exists() and alive.exists() and unknown.exists()
    assert len(list(cache.glob("*.stats"))) == 1


def test_a_recipe_with_relative_paths_never_becomes_hub_ids(capsys, models, tmp_path, monkeypatch):
    """A recipe with relative model paths run from another folder turned them into Hub ids and
    tried the network."""
    from tests.app_helpers import reload_hub_client

    base, agents = models
    monkeypatch.chdir(base.parent.parent)  # tmp_path: models are models/base, models/agent0, …
    rel = [str(Path("models") / p.name) for p in (base, *agents)]
    assert run(capsys, "merge", *rel, "--method", "ram", "--out", "first", "--quiet")[0] == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: a network attempt would show
    reload_hub_client()
    try:
        code, _, err = run(capsys, "run", tmp_path / "first" / "ram_recipe.json", "--out", "again", "--quiet")
    finally:
        monkeypatch.undo()
        reload_hub_client()
    assert code == 2 and "was a local folder" in err and "models/base" in err and "Hub (" not in err, err
    assert not (elsewhere / "again").exists()


# --- 9. the same inputs give the same model ---------------------------------------------------------------

@pytest.mark.parametrize("method", ["dare_ta", "dare_ties"])
def test_same_models_under_any_spelling_give_byte_identical_merges(capsys, tmp_path, monkeypatch, method):
    """DARE's masks were keyed by the agent reference as typed, so `demo:code`,
    `assets/demo/models/code` and `./assets/demo/models/code/` gave three different merges. Now by position."""
    import hashlib

    from merging.reading.refs import demo_root

    demo = demo_root()
    names = ["code", "tool", "memory"]
    copy = tmp_path / "elsewhere" / "copies"
    for n in ["base", *names]:
        shutil.copytree(demo / n, copy / n)
    (tmp_path / "link").symlink_to(demo)
    monkeypatch.chdir(ROOT)
    rel = os.path.relpath(demo, ROOT)
    spellings = {
        "demo": ["demo:base", *[f"demo:{n}" for n in names]],
        "absolute": [str(demo / n) for n in ["base", *names]],
        "relative": [f"{rel}/{n}" for n in ["base", *names]],
        "dotted": [f"./{rel}/{n}/" for n in ["base", *names]],
        "symlink": [str(tmp_path / "link" / n) for n in ["base", *names]],
        "copy": [str(copy / n) for n in ["base", *names]],
    }
    digests = {}
    for label, refs in spellings.items():
        out = tmp_path / f"out-{label}"
        code, _, err = run(capsys, "merge", *refs, "--method", method, "--drop-rate", "0.3", "--out", out, "--quiet")
        assert code == 0, err
        digests[label] = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(out.glob("*.safetensors")))).hexdigest()
    assert len(set(digests.values())) == 1, digests


def test_an_analysis_of_very_many_tensors_says_its_cost_before_it_starts(tmp_path, monkeypatch, capsys):
    """100,000 tiny tensors took minutes and gigabytes to analyze without a word. Above
    MANY_TENSORS float tensors `analyze` says, before the pass, how many rows of statistics it will keep and
    about how much memory that takes; below it, nothing is said."""
    import torch
    from safetensors.torch import save_file

    from analysis import stats
    from merging.reading.checkpoint import open_checkpoint

    g = torch.Generator().manual_seed(0)
    folders = []
    for name in ("base", "a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        t = {f"model.layers.{i}.w": torch.randn(4, generator=g) for i in range(40)}
        save_file(t, str(folder / "model.safetensors"))
        (folder / "config.json").write_text('{"architectures": ["Tiny"]}')
        folders.append(folder)
    with open_checkpoint(str(folders[0])) as base:
        assert stats.size_note(base, 2, [1e-5, 1e-4]) is None
        monkeypatch.setattr(stats, "MANY_TENSORS", 30)
        note = stats.size_note(base, 2, [1e-5, 1e-4])
    assert note.startswith("40 float tensors") and "240 rows" in note  # 40 × 2 ε × (2 agents + 1 pair)
    code, out, err = run(capsys, "analyze", *folders, "--no-cache")
    assert code == 0 and err.splitlines()[0].startswith("note: 40 float tensors"), err
    code, out, err = run(capsys, "analyze", *folders, "--no-cache", "--quiet")
    assert code == 0 and "note:" not in err

"""A merge never destroys inputs, never reads or leaks files from outside a model folder, never lets two
writers race, and never writes a wrong model with exit 0 (issue 10). Each test is a row of the README's
"Bad inputs and faults" table; inputs are copies, hashed before and after where it matters."""
from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from merging.errors import RamStudioError
from merging.placement import FolderTarget, commit, rename_no_replace
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
    """Issue 13: the README's `--out merged` and an app default of ./merged/NAME nested one model in another,
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
    from merging.placement import suggest_output_name

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
    from merging.tensor_merge import merge_in_memory

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
    import merging.export as export

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

@pytest.mark.parametrize("content,fragment", [("[1, 2]", "JSON list"), ('"qwen2"', "JSON str"), ("{", "not valid JSON")])
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

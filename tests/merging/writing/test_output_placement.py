"""Outputs never destroy inputs: an output is never an input, inside one or around one (checked when the command starts
and again when it writes), a folder is replaced only when RAM Studio wrote it, two writers never race, and nothing
is deleted that is not provably our own leftover. Each test is a row of the "Trust" table in docs/security.md;
inputs are copies, hashed before and after where it matters."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from merging.common.errors import RamStudioError
from merging.writing.commit import commit, rename_no_replace
from merging.writing.placement import FolderTarget
from tests.cli_helpers import (
    cli_line,
    dead_pid,
    merge_argv,
    no_leftovers,
    run,
    unshare,
)
from tests.factory import checksums
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


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


# --- 2. nothing deleted that is not provably ours -------------------------------------------------------

def test_an_input_that_looks_like_a_stale_partial_is_never_deleted(capsys, models, tmp_path):
    """An input named like a stale partial output next to the target was removed by the clean-up.
    Only a leftover holding our marker, naming this target, host and a dead process, and holding no input, goes."""
    import socket

    from merging.writing.commit import PARTIAL_MARKER

    base, agents = models
    dead = dead_pid()
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
              f"{cli_line('merge', base, *agents, '--method', 'ram', '--out', view / 'merged', '--quiet')}; echo "
              "\"rc=$?\"; "
              f"{cli_line('merge', base, *agents, '--method', 'ram', '--out', above, '--quiet', '--overwrite')}; "
              f"echo \"rc=$?\"; "
              f"{cli_line('inspect', base, *agents, '--json', view / 'report.json')}; echo \"rc=$?\"; "
              f"{cli_line('analyze', base, *agents, '--csv', view / 'stats.csv', '--quiet')}; echo \"rc=$?\"")
    proc = unshare(script)
    assert proc.stdout.count("rc=2") == 4, (proc.stdout, proc.stderr)
    assert proc.stderr.count("is inside the input") == 3 and proc.stderr.count("contains the input") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert checksums([base.parent]) == before and not (agents[0] / "merged").exists()


def test_an_empty_mount_point_is_refused_before_any_work(models, tmp_path):
    """An output that is an empty mount point failed only at the final rename."""
    base, agents = models
    out = tmp_path / "mnt"
    out.mkdir()
    proc = unshare(f"mount -t tmpfs none {out} && "
                    f"{cli_line('merge', base, *agents, '--method', 'ram', '--out', out, '--quiet')}")
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

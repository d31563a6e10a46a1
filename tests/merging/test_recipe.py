"""Recipes (`ram_recipe.json`, `ram-studio run`): inputs whose content changed since the recipe was written are refused
before any work, a tampered recipe is one clear line, relative paths never become Hub ids, and an orphan cache file
of a killed writer is cleaned up. Rows of the "Trust" table in docs/security.md."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cli_helpers import (
    dead_pid,
    merge_argv,
    run,
)
from tests.factory import join_safetensors, split_safetensors
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


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


# --- 8. rough edges answered before work ---------------------------------------------------------------

def test_an_orphan_cache_file_of_a_killed_writer_is_removed(capsys, models, tmp_path, monkeypatch):
    """An orphan `.KEY.*.tmp` stayed in the analysis cache after a kill. The next writer removes
    ours (this host, a dead writer); nothing else."""
    from analysis.cache import host_name

    base, agents = models
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("RAM_STUDIO_CACHE", str(cache))
    dead = dead_pid()
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

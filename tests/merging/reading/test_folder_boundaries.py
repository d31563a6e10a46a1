"""Only regular files inside a model folder are read: links out of the folder, an index naming files elsewhere, a Hub
cache whose blobs or snapshot lead out, hard links — each refused or skipped, before any work. Rows of the "Trust"
table in docs/security.md."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from merging.common.errors import RamStudioError
from tests.cli_helpers import (
    cache_layout,
    merge_argv,
    no_leftovers,
    run,
)
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


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


# --- 1. a cache layout that reads anything --------------------------------------------------------------

def test_blob_store_that_is_a_link_reads_nothing(capsys, models, tmp_path, monkeypatch):
    """`blobs -> /` made every file of the disk a "blob"; the process environment (HF_TOKEN) and
    any readable file were copied into the output. The blob store must be a real folder of the repo."""
    base, agents = models
    monkeypatch.setenv("HF_TOKEN", "hf_TOPSECRET_TOKEN")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    snap = cache_layout(tmp_path / "extracted", base, {
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
    snap = cache_layout(tmp_path / "hub", base, {})
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

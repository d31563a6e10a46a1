"""Outputs checked again when they are written, and written through the folder handle opened at the check: a file
that appears at the path, a hard link or a symbolic link put there, the output's folder swapped for a link into an
input or moved into one — each is refused at write time, with the input and the other file untouched."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from merging.common.errors import RamStudioError
from merging.writing.checked_output import (
    CheckedFolder,
    check_output_file,
    write_file_atomically,
)
from merging.writing.placement import protected_paths
from tests.factory import checksums


@pytest.fixture()
def setup(tmp_path):
    """An input model folder (two files) and an empty output folder beside it."""
    model = tmp_path / "models" / "base"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    (model / "model.safetensors").write_bytes(b"weights")
    out = tmp_path / "reports"
    out.mkdir()
    return model, out, protected_paths([("base", model)])


def no_partials(*folders: Path) -> None:
    for folder in folders:
        assert not [p.name for p in folder.iterdir() if ".partial-" in p.name], folder


def test_a_checked_file_is_written(setup):
    model, out, inputs = setup
    target = check_output_file(out / "r.json", inputs, overwrite=False)
    write_file_atomically(target, b"ours")
    assert (out / "r.json").read_bytes() == b"ours"
    with pytest.raises(RamStudioError, match="already written"):
        write_file_atomically(target, b"twice")
    no_partials(out)


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("what", ["file", "symlink", "dangling-symlink", "hardlink-to-input"])
def test_something_that_appears_at_the_path_is_never_replaced(setup, tmp_path, overwrite, what):
    """Nothing was at the path when it was checked, so nothing there may be replaced — with --overwrite too."""
    model, out, inputs = setup
    before = checksums([model])
    target = check_output_file(out / "r.json", inputs, overwrite=overwrite)
    path = out / "r.json"
    if what == "file":
        path.write_text("another writer's result")
    elif what == "symlink":
        (tmp_path / "elsewhere.txt").write_text("theirs")
        path.symlink_to(tmp_path / "elsewhere.txt")
    elif what == "dangling-symlink":
        path.symlink_to(tmp_path / "nothing-here")
    else:
        os.link(model / "config.json", path)
    # a hard link to an input file is named as the input itself; anything else as a file that appeared
    with pytest.raises(RamStudioError, match="appeared while this command ran|is the input"):
        write_file_atomically(target, b"ours")
    assert checksums([model]) == before
    if what == "file":
        assert path.read_text() == "another writer's result"
    elif what == "symlink":
        assert path.is_symlink() and (tmp_path / "elsewhere.txt").read_text() == "theirs"
    elif what == "dangling-symlink":
        assert path.is_symlink() and not (tmp_path / "nothing-here").exists()
    no_partials(out)


def test_overwrite_replaces_the_checked_file_only(setup):
    model, out, inputs = setup
    path = out / "r.json"
    path.write_text("old report")
    with pytest.raises(RamStudioError, match="exists"):
        check_output_file(path, inputs, overwrite=False)
    target = check_output_file(path, inputs, overwrite=True)
    write_file_atomically(target, b"new report")
    assert path.read_bytes() == b"new report"
    target = check_output_file(path, inputs, overwrite=True)
    path.unlink()
    path.write_text("another writer's result")  # a new file at the same name (often with the same inode number back)
    with pytest.raises(RamStudioError, match="replaced by another file"):
        write_file_atomically(target, b"ours")
    assert path.read_text() == "another writer's result"
    reused = 0
    for i in range(20):  # removed and written again at once: the file system gives the freed inode number back
        target = check_output_file(path, inputs, overwrite=True)
        before = path.stat().st_ino
        path.unlink()
        path.write_text(f"writer {i:02d}")  # even the same size as the file checked
        reused += path.stat().st_ino == before
        with pytest.raises(RamStudioError, match="replaced by another file"):
            write_file_atomically(target, b"ours")
        assert path.read_text() == f"writer {i:02d}"
    print(f"inode number given back in {reused} of 20")
    target = check_output_file(path, inputs, overwrite=True)
    path.unlink()  # removed meanwhile: nothing to replace, the report is written
    write_file_atomically(target, b"ours")
    assert path.read_bytes() == b"ours"
    no_partials(out)


def test_a_hard_link_to_an_input_is_refused_at_check_time(setup):
    model, out, inputs = setup
    os.link(model / "config.json", out / "r.json")
    with pytest.raises(RamStudioError, match="is the input"):
        check_output_file(out / "r.json", inputs, overwrite=True)


@pytest.mark.parametrize("how", ["link-into-input", "moved-into-input", "moved-away", "replaced"])
def test_the_outputs_folder_swapped_mid_run_is_refused(setup, tmp_path, how):
    """The report's folder, once checked, becomes a link to the input model, is moved into it (a link left at
    its old path), is moved away, or is replaced by another folder: nothing is written anywhere."""
    model, out, inputs = setup
    before = checksums([model])
    target = check_output_file(out / "r.json", inputs, overwrite=False)
    if how == "link-into-input":
        out.rename(tmp_path / "reports-old")
        out.symlink_to(model)
    elif how == "moved-into-input":
        out.rename(model / "reports")
        out.symlink_to(model / "reports")
    elif how == "moved-away":
        out.rename(tmp_path / "reports-old")
    else:
        out.rename(tmp_path / "reports-old")
        out.mkdir()
    with pytest.raises(RamStudioError, match="changed while this command ran|inside the input|is the input"):
        write_file_atomically(target, b"ours")
    if how == "moved-into-input":
        assert not (model / "reports" / "r.json").exists()
        shutil.move(str(model / "reports"), str(tmp_path / "reports-back"))  # restore the input for the hash
    assert checksums([model]) == before
    assert not list(tmp_path.rglob("r.json"))


def test_a_store_folder_is_checked_when_opened_and_before_every_write(setup, tmp_path):
    model, out, inputs = setup
    for bad in (model, model / "cache", tmp_path / "models"):
        with pytest.raises(RamStudioError, match="input"):
            CheckedFolder(bad, inputs, "score store folder", "Point RAM_STUDIO_SWEEP_CACHE elsewhere.")
    assert not (model / "cache").exists()  # refused before anything was created
    store = CheckedFolder(tmp_path / "store" / "deep", inputs, "score store folder", "hint")
    store.write("a.json", b"1")
    assert store.read("a.json", 10) == b"1" and store.read("absent.json", 10) is None
    with pytest.raises(ValueError, match="larger"):
        store.read("a.json", 0)
    os.mkfifo(tmp_path / "store" / "deep" / "fifo.json")
    with pytest.raises(ValueError, match="not a regular file"):
        store.read("fifo.json", 10)  # a FIFO never blocks a read
    (tmp_path / "store" / "deep" / "link.json").symlink_to(model / "config.json")
    with pytest.raises(ValueError, match="cannot be opened"):
        store.read("link.json", 100)  # links are not followed
    (tmp_path / "store" / "deep").rename(tmp_path / "store" / "old")
    (tmp_path / "store" / "deep").symlink_to(model)
    before = checksums([model])
    with pytest.raises(RamStudioError, match="changed while this command ran") as err:
        store.write("b.json", b"2")
    assert err.value.hint == "hint" and checksums([model]) == before


def test_a_merge_whose_folder_changed_mid_run_is_not_put_there(slow_family, tmp_path):
    """The merged model's parent folder becomes a link to an agent half way through the merge:
    the model is not put there, nothing is written into the agent, and the temporary folder is never removed
    through the swapped path."""
    from merging.merge import merge_to_folder
    from merging.recipe import MergeSpec

    base, agents = slow_family  # session inputs: hashed when made and again when the run ends
    parent = tmp_path / "out"
    parent.mkdir()
    before = checksums([base, *agents])
    swapped: list[bool] = []

    def swap(p) -> None:
        if not swapped and p.done >= p.total // 2:  # the shard is open and half written
            parent.rename(tmp_path / "out-checked")
            parent.symlink_to(agents[0])
            swapped.append(True)

    spec = MergeSpec(str(base), [str(a) for a in agents], "task_arithmetic", {}, str(parent / "merged"),
                     chunk_elems=1 << 16)
    with pytest.raises(RamStudioError, match="changed while this merge ran"):
        merge_to_folder(spec, progress=swap)
    assert swapped and checksums([base, *agents]) == before
    assert not (agents[0] / "merged").exists() and not [p for p in agents[0].iterdir() if ".partial-" in p.name]

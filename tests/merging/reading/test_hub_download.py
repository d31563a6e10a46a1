"""Hub downloads (merging/reading/hub_download.py) against a local stand-in for the Hub (tests/hub_stand_in.py): a real
HTTP server that huggingface_hub reaches through HF_ENDPOINT. The plan says what is needed before anything is fetched;
the download reports per-file and overall progress, cancels within a chunk, and resumes an interrupted file with an HTTP
Range request; the CLI shows the same progress. No network, no mocks."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from merging.common.errors import Cancelled, RamStudioError
from merging.reading.refs import hub_repos
from tests.app_helpers import reload_hub_client
from tests.factory import make_agent, make_base
from tests.hub_stand_in import StandInHub
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    """The stand-in Hub with a tiny family (org/base, org/code, org/tool) and one 2 MB model (org/big)."""
    server = StandInHub()
    base = make_base(tmp_path / "src" / "base", shard=None)
    server.add_repo("org/base", base)
    for i, name in enumerate(["code", "tool"]):
        server.add_repo(f"org/{name}", make_agent(base, tmp_path / "src" / name, 0.3, seed=i))
    big = tmp_path / "src" / "big"
    big.mkdir()
    g = torch.Generator().manual_seed(0)
    save_file({"model.embed_tokens.weight": torch.randn(1024, 1024, generator=g).to(torch.bfloat16)},
              big / "model.safetensors", metadata={"format": "pt"})
    (big / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}))
    server.add_repo("org/big", big)
    server.start()
    env = {"HF_ENDPOINT": server.url, "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HUB_DISABLE_XET": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    reload_hub_client()
    server.env = env
    server.cache = tmp_path / "hf-cache"
    yield server
    server.stop()
    monkeypatch.undo()
    reload_hub_client()


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_plan_says_what_is_needed_before_fetching_anything(hub):
    from merging.reading.hub_download import plan_download

    plan = plan_download(hub_repos(["org/base", "org/code", "demo:base"]))
    assert [r.repo_id for r in plan.repos] == ["org/base", "org/code"]  # demo and local refs are not Hub models
    sizes = {(f.repo_id, f.name): f.size for f in plan.files}
    for repo in ("org/base", "org/code"):
        for name, served in hub.repos[repo].files.items():
            assert sizes[(repo, name)] == len(served.data)
    assert plan.total == plan.remaining == sum(sizes.values()) and plan.cached == plan.partial == 0
    assert plan.cache_dir == hub.cache and plan.free() > 0
    assert not [r for r in hub.log if r.method == "GET" and "/resolve/" in r.path]  # metadata only


def test_download_reports_progress_and_links_a_usable_snapshot(hub):
    from merging.reading.checkpoint import open_checkpoint
    from merging.reading.hub_download import download, plan_download

    plan = plan_download(hub_repos(["org/base", "org/code"]))
    seen = []
    folders = download(plan, progress=seen.append)
    assert set(folders) == {"org/base", "org/code"}
    last = seen[-1]
    assert last.done == last.total == plan.total and last.files_done == last.files_total == len(plan.files)
    assert last.fetched == plan.total and last.rate > 0 and last.fraction == 1.0
    assert [p.done for p in seen] == sorted(p.done for p in seen)  # overall bytes only grow
    for p in seen:
        assert 0 <= p.file_done <= p.file_total and p.file in hub.repos[p.repo_id].files
    for repo in ("org/base", "org/code"):
        for name, served in hub.repos[repo].files.items():
            assert sha256(folders[repo] / name) == served.sha256
    with open_checkpoint("org/base", download=False) as ckpt:  # now in the cache: opened without the network
        assert ckpt.folder == folders["org/base"]
    again = plan_download(hub_repos(["org/base", "org/code"]))
    assert again.remaining == 0 and again.cached == plan.total
    before = len(hub.log)
    download(again)
    assert not [r for r in hub.log[before:] if r.method == "GET" and "/resolve/" in r.path]  # nothing fetched


def test_cancel_keeps_the_partial_file_and_the_next_download_resumes(hub):
    """Cancel mid-file: the partial blob stays; the next download asks for the rest with a Range request and
    receives only the missing bytes; the result is byte-identical."""
    from merging.reading.hub_download import download, plan_download

    hub.rate = 1_000_000  # 2 MB take about 2 s
    size = len(hub.repos["org/big"].files["model.safetensors"].data)
    cancel = threading.Event()

    def stop_halfway(p) -> None:
        if p.file == "model.safetensors" and p.file_done > size // 3:
            cancel.set()

    plan = plan_download(hub_repos(["org/big"]))
    with pytest.raises(Cancelled, match="next download resumes"):
        download(plan, progress=stop_halfway, cancel=cancel)
    resumed = plan_download(hub_repos(["org/big"]))
    part = [f for f in resumed.files if f.name == "model.safetensors"][0]
    assert size // 3 < part.partial < size and resumed.remaining == size - part.partial + sum(
        f.size for f in resumed.files if f.name != "model.safetensors" and not f.cached)
    hub.rate = None
    seen, kept, missing = [], part.partial, resumed.remaining
    folders = download(resumed, progress=seen.append)
    gets = hub.body_bytes("model.safetensors")
    assert gets[-1] == (f"bytes={kept}-", size - kept)  # only the missing bytes were sent
    assert seen[-1].fetched == missing and seen[-1].done == resumed.total
    assert sha256(folders["org/big"] / "model.safetensors") == hub.repos["org/big"].files["model.safetensors"].sha256
    assert not list(hub.cache.rglob("*.incomplete"))


def test_a_server_that_ignores_range_or_a_damaged_partial_never_gives_a_wrong_file(hub):
    from merging.reading.hub_download import download, plan_download

    served = hub.repos["org/big"].files["model.safetensors"]
    plan = plan_download(hub_repos(["org/big"]))
    f = [x for x in plan.files if x.name == "model.safetensors"][0]
    part = f.blob.with_name(f.etag + ".incomplete")
    part.parent.mkdir(parents=True)
    part.write_bytes(served.data[:1000])
    hub.honour_range = False  # answers 200 with the whole file: the partial is dropped, not appended to
    folders = download(plan_download(hub_repos(["org/big"])))
    assert sha256(folders["org/big"] / "model.safetensors") == served.sha256
    assert hub.body_bytes("model.safetensors")[-1] == ("bytes=1000-", len(served.data))

    other = plan_download(hub_repos(["org/code"]))
    g = [x for x in other.files if x.name.endswith(".safetensors")][0]
    bad = g.blob.with_name(g.etag + ".incomplete")
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_bytes(b"\0" * 100)  # not the file's first bytes
    hub.honour_range = True
    with pytest.raises(RamStudioError, match="arrived damaged"):
        download(plan_download(hub_repos(["org/code"])))
    assert not bad.exists()
    download(plan_download(hub_repos(["org/code"])))  # the next try starts clean


def test_not_enough_disk_space_is_said_before_downloading(hub, monkeypatch):
    import shutil as sh

    from merging.reading.hub_download import download, plan_download

    plan = plan_download(hub_repos(["org/big"]))
    real = sh.disk_usage
    monkeypatch.setattr(sh, "disk_usage", lambda p: real(p)._replace(free=plan.remaining // 2))
    with pytest.raises(RamStudioError, match="not enough disk space") as err:
        download(plan)
    assert str(hub.cache) in err.value.message and "HF_HUB_CACHE" in err.value.hint
    assert not [r for r in hub.log if r.method == "GET" and "/resolve/" in r.path]


def test_unreachable_hub_is_one_readable_line(hub):
    from merging.reading.hub_download import plan_download

    hub.stop()
    with pytest.raises(RamStudioError) as err:
        plan_download(hub_repos(["org/base"]))
    assert "cannot reach the Hugging Face Hub" in err.value.message and "refused" in err.value.message
    assert "Errno" not in str(err.value) and "HF_HUB_OFFLINE" not in str(err.value)


def cli(hub, *args, timeout=300):
    env = {**os.environ, **hub.env}
    return subprocess.run([sys.executable, "-m", "ram_studio", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_download_shows_the_plan_and_progress_and_merge_downloads_first(hub, tmp_path):
    """`ram-studio download` says how much and where before fetching, then shows per-file and overall
    progress; `merge` of Hub models downloads first with the same progress."""
    hub.rate = 2_000_000
    r = cli(hub, "download", "org/big")
    assert r.returncode == 0, r.stderr
    assert "to download" in r.stdout and str(hub.cache) in r.stdout and "free" in r.stdout
    assert "model.safetensors" in r.stderr and "org/big" in r.stderr and "/s" in r.stderr
    assert "100.0%" in r.stderr
    r = cli(hub, "download", "org/big")
    assert r.returncode == 0 and "already in the cache" in r.stdout
    hub.rate = None
    out = tmp_path / "merged"
    r = cli(hub, "merge", "org/base", "org/code", "org/tool", "--method", "ram", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "download" in r.stderr and "org/tool" in r.stderr and (out / "config.json").exists()
    card = (out / "README.md").read_text()
    import yaml

    front = yaml.safe_load(card.split("---")[1])
    assert front["base_model"][0] == "org/base" and front["base_model_relation"] == "merge"  # Hub ids listed


def test_every_download_path_resumes(hub):
    """A model opened by the library itself (open_checkpoint: what merge_to_folder and analyze call) also goes
    through the resumable, checked download: a partial file left by a cancel is continued, not refetched."""
    from merging.reading.checkpoint import open_checkpoint
    from merging.reading.hub_download import download, plan_download

    hub.rate = 1_000_000
    size = len(hub.repos["org/big"].files["model.safetensors"].data)
    cancel = threading.Event()
    with pytest.raises(Cancelled):
        download(plan_download(hub_repos(["org/big"])), cancel=cancel,
                 progress=lambda p: cancel.set() if p.file == "model.safetensors" and p.file_done > 0 else None)
    kept = [f for f in plan_download(hub_repos(["org/big"])).files if f.name == "model.safetensors"][0].partial
    assert 0 < kept < size
    hub.rate = None
    with open_checkpoint("org/big") as ckpt:
        assert sha256(ckpt.folder / "model.safetensors") == hub.repos["org/big"].files["model.safetensors"].sha256
    assert hub.body_bytes("model.safetensors")[-1] == (f"bytes={kept}-", size - kept)


@pytest.mark.parametrize("oid", ["../../../../escape", "ab/cd" + "0" * 60, "not-hex-at-all", ""])
def test_a_forged_file_id_from_the_hub_is_one_line_and_writes_nothing(hub, oid):
    """A Hub endpoint returning an etag with '/' gave a ValueError traceback from plan_download
    (and an id with '..' would name a blob path outside the cache). Ids, paths and sizes are checked first."""
    hub.forged_oids = {"config.json": oid, "model.safetensors": oid}
    r = cli(hub, "download", "org/base")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and "not valid" in r.stderr
    assert not [p for p in Path(hub.cache).rglob("*") if p.is_file()]

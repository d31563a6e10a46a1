"""The Hugging Face cache a download writes into follows the placement rules too: HF_HUB_CACHE pointing at (or
into) a local model folder named beside the Hub models is refused in one line before anything is downloaded."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.app_helpers import reload_hub_client
from tests.cli_helpers import run
from tests.factory import checksums

DEMO = Path(__file__).resolve().parents[2] / "assets" / "demo" / "models"


@pytest.mark.parametrize("where", ["is", "inside"])
def test_a_hub_cache_inside_a_local_input_is_refused(capsys, tmp_path, monkeypatch, where):
    base = shutil.copytree(DEMO / "base", tmp_path / "base")
    before = checksums([base])
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(base if where == "is" else base / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing may be asked of any Hub
    reload_hub_client()
    try:
        code, _, err = run(capsys, "inspect", base, "someone/agent-a", "someone/agent-b")
    finally:
        monkeypatch.undo()
        reload_hub_client()
    assert code == 2 and "Hugging Face cache folder" in err and "HF_HUB_CACHE" in err, err
    assert checksums([base]) == before and not (base / "hub").exists()

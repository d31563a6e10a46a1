"""Shared fixtures: an isolated analysis cache and a tiny real Qwen2 family (sharded bf16 safetensors)."""
from __future__ import annotations

import pytest

from tests.factory import make_family


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own analysis cache, so results never leak between tests."""
    monkeypatch.setenv("RAM_STUDIO_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def family(tmp_path_factory):
    """Base (2 shards + index) and three agents with densities 5 %, 40 %, 50 %."""
    root = tmp_path_factory.mktemp("family")
    return make_family(root)

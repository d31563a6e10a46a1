"""The app with Hub models, against the local stand-in Hub (tests/hub_stand_in.py, reached through
HF_ENDPOINT): the Models page says what a download needs and where it goes, shows per-file and overall
progress, cancels, continues without fetching again what it has; unreachable ids are named, every one,
and never selected."""
from __future__ import annotations

import time

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from tests.app_helpers import APP_MAIN, build_demo, plain, reload_hub_client
from tests.hub_stand_in import StandInHub

pytestmark = pytest.mark.timeout(300)


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    server = StandInHub()
    family = build_demo(tmp_path / "family")
    for name in ("base", "code", "tool", "memory"):
        server.add_repo(f"org/{name}", family / name)
    server.start()
    env = {"HF_ENDPOINT": server.url, "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HUB_DISABLE_XET": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "RAM_STUDIO_CACHE": str(tmp_path / "cache"), "RAM_STUDIO_DEMO_ROOT": str(family)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    reload_hub_client()
    st.cache_data.clear()
    st.cache_resource.clear()
    server.cache = tmp_path / "hf-cache"
    yield server
    server.stop()
    monkeypatch.undo()
    reload_hub_client()
    st.cache_data.clear()
    st.cache_resource.clear()


def new_app() -> AppTest:
    return AppTest.from_file(str(APP_MAIN), default_timeout=120)


def choose(at: AppTest, base: str, agents: list[str]) -> None:
    at.switch_page("views/models.py").run()
    at.radio(key="model_source").set_value("Custom: local folders or Hub ids").run()
    at.text_input(key="custom_base").set_value(base).run()
    at.text_area(key="custom_agents").set_value("\n".join(agents)).run()


def texts(at: AppTest, kind: str = "progress") -> list[str]:
    return [plain(e.proto.text) for e in at.get(kind)]


def wait(at: AppTest, pred, what: str, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        if pred(at):
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {texts(at)}")


def test_download_from_the_models_page_with_progress_cancel_and_continue(hub):
    agents = ["org/code", "org/tool", "org/memory"]
    at = new_app()
    choose(at, "org/base", agents)
    at.button(key="check_compat").click().run()
    assert not at.error, [plain(e.value) for e in at.error]
    assert any("Compatible" in plain(s.value) for s in at.success)  # from remote headers, before any download
    assert not [r for r in hub.log if r.method == "GET" and r.path.endswith(".safetensors") and r.range is None]
    metrics = {m.label: m.value for m in at.metric}
    total = sum(len(f.data) for r in hub.repos.values() for f in r.files.values())
    n_files = sum(len(r.files) for r in hub.repos.values())
    missing = int(metrics["Files"].split()[0])  # the header check already cached the small JSON files
    assert metrics["Files"] == f"{missing} of {n_files} missing" and 4 * 3 <= missing < n_files
    assert "To download" in metrics and "Free on that disk" in metrics
    assert any(str(hub.cache) in plain(c.value) and "Hugging Face cache" in plain(c.value) for c in at.caption)

    hub.rate = 60_000  # slow enough to watch and to cancel between files
    at.button(key="download_start").click().run()
    wait(at, lambda a: any(t.startswith("Overall:") and " of 4" not in t for t in texts(a)) and
         any("files" in t and not t.startswith("Overall: 0 B") for t in texts(a)), "progress")
    overall = next(t for t in texts(at) if t.startswith("Overall:"))
    assert "/s" in overall and "files" in overall
    assert any(" · " in t and "org/" in t for t in texts(at))  # the current file: repo · name: bytes of bytes
    wait(at, lambda a: any(t.startswith("Overall:") and not t.endswith(f" {n_files - missing} of {n_files} files")
                           for t in texts(a)), "a file done")
    at.button(key="download_cancel").click().run()
    wait(at, lambda a: any("cancelled" in plain(i.value) for i in a.info), "the cancel")
    assert "resumes" in next(plain(i.value) for i in at.info if "cancelled" in plain(i.value))
    fetched_before = {r.path for r in hub.log if r.method == "GET" and "/resolve/" in r.path and r.sent and
                      r.range is None}
    label = next(b.label for b in at.button if b.key == "download_start")
    assert label.startswith("Continue the download")

    hub.rate = None
    at.button(key="download_start").click().run()
    wait(at, lambda a: any("Downloaded" in plain(s.value) for s in a.success), "the end")
    again = [r.path for r in hub.log if r.method == "GET" and "/resolve/" in r.path and r.range is None]
    assert len(again) == len(set(again)), "a finished file was fetched twice"
    assert fetched_before  # some files were complete before the cancel, and were not fetched again

    at.button(key="use_models").click().run()
    assert any("Selected" in plain(s.value) for s in at.success)
    at.switch_page("views/heterogeneity.py").run()
    assert not at.exception and not at.error, [plain(e.value) for e in at.error]
    assert len(at.get("plotly_chart")) >= 5  # analysed from the cache
    assert total > 0


def test_unreachable_hub_names_every_model_and_selects_none(hub):
    hub.stop()
    at = new_app()
    before = at.run().session_state["ram_selection"]
    choose(at, "org/base", ["org/code", "org/tool"])
    at.button(key="check_compat").click().run()
    assert not at.exception
    listed = next(plain(e.value) for e in at.error if "could not be read" in plain(e.value))
    assert "3 of 3 models" in listed and all(r in listed for r in ("org/base", "org/code", "org/tool"))
    assert "refused" in listed and "Errno" not in listed and "HF_HUB_OFFLINE" not in listed
    at.button(key="use_models").click().run()
    assert any("not selected" in plain(e.value) for e in at.error)
    assert at.session_state["ram_selection"] == before

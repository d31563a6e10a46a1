"""Shared helpers for the app tests: a demo folder (the real one when complete, else tiny generated models)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

DEMO_NAMES = ("base", "code", "tool", "memory")
APP_MAIN = Path(__file__).resolve().parent.parent / "app" / "main.py"


def real_demo_complete() -> bool:
    """The bundled demo exists with all four models (config + safetensors each)."""
    from merging.reading.refs import BUNDLED_DEMO_ROOT

    return all((BUNDLED_DEMO_ROOT / n / "config.json").exists() and any((BUNDLED_DEMO_ROOT / n).glob("*.safetensors"))
               for n in DEMO_NAMES)


def build_demo(root: Path) -> Path:
    """Tiny Qwen2 base + three sparse agents named like the demo's, under `root` (about a second)."""
    from tests.factory import make_agent, make_base

    base = make_base(root / "base")
    for i, (name, density) in enumerate([("code", 0.05), ("tool", 0.4), ("memory", 0.5)]):
        make_agent(base, root / name, density, seed=100 + i)
    return root


def app_env(tmp: Path, use_real_demo: bool | None = None) -> dict[str, str]:
    """Environment for the app under test: isolated analysis and sweep caches, offline Hub, demo root if needed."""
    env = {"RAM_STUDIO_CACHE": str(tmp / "cache"), "RAM_STUDIO_SWEEP_CACHE": str(tmp / "sweeps"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    if use_real_demo is None:
        use_real_demo = real_demo_complete() and not os.environ.get("RAM_STUDIO_TEST_TINY_DEMO")
    if not use_real_demo:
        env["RAM_STUDIO_DEMO_ROOT"] = str(build_demo(tmp / "demo"))
    return env


def reload_hub_client() -> None:
    """huggingface_hub reads HF_ENDPOINT, HF_HUB_CACHE and HF_HUB_OFFLINE when its constants module loads: after
    changing them in a test process, reload it (else a test meant to be offline may still try the network)."""
    import importlib

    import huggingface_hub.constants as c

    importlib.reload(c)


def plain(markdown: str) -> str:
    """What a Markdown element shows, for text assertions: the app escapes every punctuation character of
    text that comes from files or users (`app.markup.md`), and the page shows it without the backslashes."""
    import re

    shown = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown).replace("\u2060", "")  # and its autolink breakers
    return re.sub(r"&#(\d+);", lambda m: chr(int(m.group(1))), shown)  # white space at the ends, as entities


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp: Path, env: dict[str, str], timeout: float = 60, script: Path = APP_MAIN):
    """`streamlit run app/main.py` (or another `script`) on a free loopback port with `env`, its output in
    tmp/streamlit.log; returns (process, url) once it answers its health check (the caller stops it: stop_server)."""
    import subprocess
    import sys
    import time
    import urllib.request

    port = free_port()
    log = open(tmp / "streamlit.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(script), "--server.port", str(port),
                             "--server.headless", "true", "--server.address", "127.0.0.1"],
                            cwd=APP_MAIN.parent.parent, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.3)
    stop_server(proc)
    raise RuntimeError("streamlit did not start: " + (tmp / "streamlit.log").read_text()[-2000:])


def stop_server(proc) -> None:
    import subprocess

    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def legend_off_the_plot(layout) -> bool:
    """A chart's legend stands beside the plot (right, top-aligned) or above it in the band under the title —
    where the layout rule (app/charts/layout.py) puts it for the chart's width — never over the plot."""
    lg = layout.legend
    beside = lg.x is not None and lg.x >= 1 and lg.xanchor == "left"
    above = (lg.orientation == "h" and lg.yref == "container" and lg.yanchor == "top" and lg.y is not None
             and (1 - lg.y) * layout.height < layout.margin.t)
    return beside or above


def new_app() -> AppTest:
    return AppTest.from_file(str(APP_MAIN), default_timeout=120)


def figure(at: AppTest, key: str):
    """The plotly figure a chart element drew, with plotly's typed arrays ({dtype, bdata}) decoded to lists."""
    import base64

    import numpy as np
    import plotly.graph_objects as go

    def decode(v):
        if isinstance(v, dict) and {"dtype", "bdata"} <= set(v):
            arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
            shape = [int(x) for x in str(v.get("shape", len(arr))).split(",")]
            return arr.reshape(shape).tolist()
        if isinstance(v, dict):
            return {k: decode(x) for k, x in v.items()}
        if isinstance(v, list):
            return [decode(x) for x in v]
        return v

    spec = json.loads([c for c in at.get("plotly_chart") if c.key == key][0].proto.spec)
    return go.Figure(decode(spec))


def no_problems(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [plain(e.value) for e in at.error]


def wait_merge(at: AppTest, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        at.run()
        finished = not at.button(key="start_merge").disabled  # disabled while this session's job runs
        if finished and (at.success or at.error or at.info):
            return
        time.sleep(0.3)
    raise AssertionError("merge did not finish in time")


def open_page_by_link(pg, title: str, timeout_ms: int = 60_000) -> None:
    """Click the sidebar link to the page `title` and wait for its heading. A click within the first seconds of a
    session can be overtaken by the run the browser's first width report starts (the page stays where it was: a
    known race of the app); the link is then clicked once more, as a user would."""
    link = pg.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first
    heading = pg.get_by_role("heading", name=title, level=1)
    link.click()
    try:
        heading.wait_for(timeout=20_000)
    except Exception:  # noqa: BLE001 — overtaken: click again, then the full wait decides
        link.click()
        heading.wait_for(timeout=timeout_ms)


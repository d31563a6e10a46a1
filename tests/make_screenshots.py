"""Screenshots of every page for the README: `python -m tests.make_screenshots [--out assets/images] [--pages a,b]
[--long-names] [--width 1400] [--schemes light,dark]`.

Starts `streamlit run app/main.py` on the bundled demo (isolated analysis cache and sweep store, Hub offline), opens
every page in headless chromium at 1400 px, once with the browser set to light and once to dark, runs a merge so the
Merge page shows its results and a sweep so the Sweep page shows its results, and saves full-page PNGs as
app-<page>-<light|dark>.png. `--long-names` first selects copies of the demo models named like the paper's
(Qwen2.5-7B-Instruct, ReasonFlux-Coder-7B, …), to check that the charts stay readable with them (files are then named
app-<page>-long-names-<scheme>.png). Then the Heterogeneity page's "Is the overlap real?" panel on copies named like the
paper's agents, as app-overlap-<scheme>.png; `--only overlap` takes just those.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.browser.chromium import ARGS, CHROMIUM

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"models": "Models", "heterogeneity": "Heterogeneity", "tune": "Tune", "dilution": "Signal dilution",
         "sweep": "Sweep", "merge": "Merge & export"}
# The sweep the Sweep page's screenshot shows: the r ablation next to two baselines' searches.
SWEEP_YAML = ("grids:\n  - ram_plus r=0,0.05,0.1,0.15,0.2\n  - task_arithmetic lambda=0.3,0.5,0.7,1.0\n"
              "  - ties lambda=0.5,1.0 density=0.1,0.2,0.3\n")
SWEEP_EXAMPLES = 40  # per task and split: readable differences, a couple of minutes on a CPU
PAPER_NAMES = {"base": "Qwen2.5-7B-Instruct", "code": "ReasonFlux-Coder-7B",
               "tool": "Qwen2.5-7B-Instruct-ToolRL-grpo-cold", "memory": "RL-MemoryAgent-7B"}


def settle(pg, timeout: float = 180) -> None:
    """Until no script runs and the page's height has stayed the same for 2 s."""
    deadline = time.time() + timeout
    last, stable = None, 0
    while time.time() < deadline and stable < 12:
        pg.wait_for_timeout(250)
        h = pg.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
        busy = pg.locator('[data-testid="stStatusWidget"], [data-testid="stProgress"], '
                          '[data-testid="stSpinner"], [data-stale="true"]').count() > 0
        stable = stable + 1 if (h == last and not busy) else 0
        last = h


def full_page(pg, path: Path, width: int) -> None:
    """Streamlit scrolls inside its main container: grow the viewport to the page's height, then shoot."""
    h = pg.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
    pg.set_viewport_size({"width": width, "height": int(h) + 20})
    settle(pg)
    pg.screenshot(path=str(path))
    pg.set_viewport_size({"width": width, "height": 900})
    from PIL import (
        Image,  # 256 colours: a third of the size, no visible loss on these pages
    )

    Image.open(path).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                                             dither=Image.Dither.NONE).save(path, optimize=True)


def run_sweep(pg) -> None:
    """Load SWEEP_YAML into the Sweep page, score SWEEP_EXAMPLES examples per task, wait for the results (models
    that are not the bundled demo's, such as the paper-named copies, are scored with the demo's tasks too)."""
    demo_tasks = pg.get_by_role("radio", name="Demo tasks")
    if not demo_tasks.is_checked():
        pg.get_by_text("Demo tasks", exact=True).first.click()
        settle(pg)
    pg.get_by_text("Grids as YAML").click()
    pg.get_by_role("textbox", name="Paste grids (YAML) to replace these").fill(SWEEP_YAML)
    pg.get_by_role("button", name="Load the pasted grids").click()
    settle(pg)
    pg.get_by_text("Grids as YAML").click()  # closed again
    box = pg.get_by_role("spinbutton", name="Examples per task (0: all)")
    box.fill(str(SWEEP_EXAMPLES))
    box.press("Enter")
    settle(pg)
    pg.get_by_role("button", name="Start sweep").click()
    pg.get_by_text("candidates scored on validation, the").wait_for(timeout=1_200_000)
    pg.locator('[data-testid="stPlotlyChart"] .main-svg').first.wait_for()
    settle(pg)


def select_long_names(pg, folders: dict[str, Path]) -> None:
    """The copies of the demo models under the paper's model names (paper_named_copies), chosen on the Models page."""
    from tests.app_helpers import open_page_by_link

    # on the bare root, wait for its forward to a page and for the run the browser's first width report starts:
    # a click before both have happened can be overtaken by them (from any other page there is nothing to wait for)
    pg.wait_for_url(lambda u: urllib.parse.urlsplit(u).path.strip("/") != "")
    settle(pg)
    open_page_by_link(pg, "Models")
    pg.get_by_text("Custom: local folders or Hub ids").click()
    base = pg.get_by_role("textbox", name="Base model")
    base.fill(str(folders["base"]))
    base.press("Enter")
    agents = pg.get_by_role("textbox", name="Agents (one per line)")
    agents.fill("\n".join(str(folders[k]) for k in ("code", "tool", "memory")))
    agents.press("Control+Enter")
    settle(pg)
    pg.get_by_role("button", name="Use these models").click()
    settle(pg)


def paper_named_copies(root: Path) -> dict[str, Path]:
    """The demo models copied into folders named like the paper's models (labels come from folder names)."""
    from merging.reading.refs import BUNDLED_DEMO_ROOT

    out = {}
    for demo_name, paper_name in PAPER_NAMES.items():
        out[demo_name] = shutil.copytree(BUNDLED_DEMO_ROOT / demo_name, root / paper_name)
    return out


def overlap_panel(pg, path: Path, width: int, folders: dict[str, Path]) -> None:
    """Select the paper-named copies on the Models page, then shoot the Heterogeneity page's overlap panel: from
    its heading to the next section's."""
    pg.locator('[data-testid="stSidebarNav"] a').filter(has_text="Models").first.click()
    pg.get_by_role("heading", name="Models", level=1).wait_for()
    settle(pg)
    pg.get_by_text("Custom: local folders or Hub ids").click()
    settle(pg)
    pg.get_by_role("textbox", name="Base model").fill(str(folders["base"]))
    pg.get_by_role("textbox",
                   name="Agents (one per line)").fill("\n".join(str(folders[a]) for a in ("code", "tool", "memory")))
    pg.get_by_role("textbox", name="Agents (one per line)").press("Control+Enter")
    settle(pg)
    pg.get_by_role("button", name="Use these models").click()
    settle(pg)
    pg.locator('[data-testid="stSidebarNav"] a').filter(has_text="Heterogeneity").first.click()
    pg.get_by_role("heading", name="Is the overlap real?").wait_for()
    settle(pg)
    h = pg.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
    pg.set_viewport_size({"width": width, "height": int(h) + 20})
    settle(pg)
    top = pg.get_by_role("heading", name="Is the overlap real?").bounding_box()["y"] - 10
    end = pg.get_by_role("heading", name="Overlap-unique ratio").bounding_box()["y"] - 10
    pg.screenshot(path=str(path), clip={"x": 0, "y": top, "width": width, "height": end - top})
    pg.set_viewport_size({"width": width, "height": 900})
    from PIL import Image

    Image.open(path).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                                             dither=Image.Dither.NONE).save(path, optimize=True)


def main(argv: list[str] | None = None) -> int:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "assets" / "images"))
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--pages", default=",".join(PAGES), help=f"which pages (default all: {','.join(PAGES)})")
    ap.add_argument("--long-names", action="store_true", help="the demo models under the paper's long model names")
    ap.add_argument("--only", choices=["overlap"], help="take only the overlap panel shots")
    ap.add_argument("--schemes", default="light,dark", help="which colour schemes (default light,dark)")
    args = ap.parse_args(argv)
    pages = {k: PAGES[k] for k in args.pages.split(",") if k}
    suffix = "-long-names" if args.long_names else ""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ram-shots-"))
    folders = paper_named_copies(tmp / "paper-names")
    env = {**os.environ, "RAM_STUDIO_CACHE": str(tmp / "cache"), "RAM_STUDIO_SWEEP_CACHE": str(tmp / "sweeps"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"),
                             "--server.port", str(args.port), "--server.headless", "true"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # reads .streamlit/
    url = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(120):
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        with sync_playwright() as p:
            # scroll bars as people see them (Playwright hides them by default): a wide table's only cue
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True,
                                        ignore_default_args=["--hide-scrollbars"])
            for scheme in [s for s in args.schemes.split(",") if s]:
                ctx = browser.new_context(viewport={"width": args.width, "height": 900}, color_scheme=scheme)
                pg = ctx.new_page()
                pg.set_default_timeout(180_000)
                pg.goto(url)
                pg.wait_for_selector('[data-testid="stAppViewContainer"]')
                settle(pg)
                if args.long_names:
                    select_long_names(pg, folders)
                for name, title in ({} if args.only else pages).items():
                    pg.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first.click()
                    pg.get_by_role("heading", name=title, level=1).wait_for()
                    settle(pg)
                    if name == "sweep":  # show a finished sweep: its table and charts
                        run_sweep(pg)
                    if name == "merge":  # show a finished merge and its downloads
                        box = pg.get_by_role("textbox", name="Output folder")
                        box.fill(str(tmp / f"merged-{scheme}"))
                        box.press("Enter")
                        settle(pg)
                        pg.get_by_role("button", name="Start merge").click()
                        pg.get_by_text("Merged into").wait_for()
                        settle(pg)
                    full_page(pg, out / f"app-{name}{suffix}-{scheme}.png", args.width)
                    print(f"{scheme} {name}", flush=True)
                overlap_panel(pg, out / f"app-overlap-{scheme}.png", args.width, folders)
                print(f"{scheme} overlap panel", flush=True)
                ctx.close()
            browser.close()
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)  # our own temporary folder (copies, cache, merges)
    return 0


if __name__ == "__main__":
    sys.exit(main())

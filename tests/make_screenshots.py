"""Screenshots of every page for the README: `python -m tests.make_screenshots [--out assets/images]`.

Starts `streamlit run app/main.py` on the bundled demo (isolated analysis cache, Hub offline), opens every page
in headless chromium at 1400 px, once with the browser set to light and once to dark, runs a merge so the
Merge page shows its results, and saves full-page PNGs as app-<page>-<light|dark>.png.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"models": "Models", "heterogeneity": "Heterogeneity", "tune": "Tune", "dilution": "Signal dilution",
         "merge": "Merge & export"}
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]


def settle(pg, timeout: float = 180) -> None:
    """Until no script runs and the page's height has stayed the same for 2 s."""
    deadline = time.time() + timeout
    last, stable = None, 0
    while time.time() < deadline and stable < 12:
        pg.wait_for_timeout(250)
        h = pg.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
        busy = pg.locator('[data-testid="stStatusWidget"], [data-testid="stProgress"], '
                          '[data-testid="stSpinner"]').count() > 0
        stable = stable + 1 if (h == last and not busy) else 0
        last = h


def full_page(pg, path: Path, width: int) -> None:
    """Streamlit scrolls inside its main container: grow the viewport to the page's height, then shoot."""
    h = pg.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
    pg.set_viewport_size({"width": width, "height": int(h) + 20})
    settle(pg)
    pg.screenshot(path=str(path))
    pg.set_viewport_size({"width": width, "height": 900})
    from PIL import Image  # 256 colours: a third of the size, no visible loss on these pages

    Image.open(path).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                                             dither=Image.Dither.NONE).save(path, optimize=True)


def main(argv: list[str] | None = None) -> int:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "assets" / "images"))
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--port", type=int, default=8765)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ram-shots-"))
    env = {**os.environ, "RAM_STUDIO_CACHE": str(tmp / "cache"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
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
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            for scheme in ("light", "dark"):
                ctx = browser.new_context(viewport={"width": args.width, "height": 900}, color_scheme=scheme)
                pg = ctx.new_page()
                pg.set_default_timeout(180_000)
                pg.goto(url)
                pg.wait_for_selector('[data-testid="stAppViewContainer"]')
                settle(pg)
                for name, title in PAGES.items():
                    pg.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first.click()
                    pg.get_by_role("heading", name=title, level=1).wait_for()
                    settle(pg)
                    if name == "merge":  # show a finished merge and its downloads
                        box = pg.get_by_role("textbox", name="Output folder")
                        box.fill(str(tmp / f"merged-{scheme}"))
                        box.press("Enter")
                        settle(pg)
                        pg.get_by_role("button", name="Start merge").click()
                        pg.get_by_text("Merged into").wait_for()
                        settle(pg)
                    full_page(pg, out / f"app-{name}-{scheme}.png", args.width)
                    print(f"{scheme} {name}", flush=True)
                ctx.close()
            browser.close()
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

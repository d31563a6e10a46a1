"""The system chromium the browser tests drive (Debian's `chromium` package), how they launch it, and the mark that
skips a browser test where it is not installed — unless RAM_STUDIO_REQUIRE_BROWSER is set (CI), where a missing
chromium fails the test instead."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
REQUIRED = bool(os.environ.get("RAM_STUDIO_REQUIRE_BROWSER"))
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists() and not REQUIRED,
                                    reason="system chromium not installed")

"""The app's server terminal stays free of transformers' "Loading weights" bars (every model an evaluation loads
printed one): `app.quiet.quiet_library_bars`, which app/main.py calls, turns them off — shown on a real tiny model
loaded by transformers in a fresh process, next to the same load without it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LOAD = """
import sys
if sys.argv[2] == "quiet":
    from app.quiet import quiet_library_bars
    quiet_library_bars()
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_pretrained(sys.argv[1])
"""


def load(model: Path, mode: str) -> str:
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", LOAD, str(model), mode], capture_output=True, text=True, env=env,
                          cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def test_loading_weights_bars_are_off_in_the_server(tmp_path):
    from tests.factory import make_base

    model = make_base(tmp_path / "base")
    assert "Loading weights" in load(model, "loud")  # the bar the server's terminal used to fill with
    assert "Loading weights" not in load(model, "quiet")

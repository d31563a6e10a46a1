"""The app's server terminal is not the place for library progress bars: every model an evaluation, a sweep or
an A | B score loads would print transformers' "Loading weights" bar there. The pages report progress themselves."""
from __future__ import annotations

import os
import sys


def quiet_library_bars() -> None:
    """Progress bars of transformers and huggingface_hub off for this process (a user's own
    HF_HUB_DISABLE_PROGRESS_BARS setting is kept): through the environment before they are imported, and
    directly when they already are."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"].strip().lower() in ("0", "false", "no", "off"):
        return
    if "transformers.utils.logging" in sys.modules:
        sys.modules["transformers.utils.logging"].disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()

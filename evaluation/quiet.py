"""Keep third-party chatter off the user's terminal while a model is loaded or scored: transformers' loading
bars and warnings, lm-eval's and the datasets library's INFO log (our own progress is reported instead).
tqdm reads `TQDM_DISABLE` once, when it is first imported: a command that wants lm-eval's own bars off sets it
before importing anything (as `ram-studio evaluate` does)."""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator

_LOGGERS = ("lm_eval", "lm-eval", "transformers", "datasets", "accelerate", "huggingface_hub")


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Within the block: library loggers at ERROR, progress bars off (restored afterwards)."""
    saved_levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    undo = []
    try:
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        undo.append(lambda: (hf_logging.set_verbosity(verbosity),
                             hf_logging.enable_progress_bar() if bars else None))
    except ImportError:  # transformers is a dependency; kept optional here for a bare import
        pass
    try:
        yield
    finally:
        for fn in undo:
            fn()
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)

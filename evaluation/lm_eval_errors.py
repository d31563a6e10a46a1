"""An exception raised inside an lm-evaluation-harness task's own code (process_results, a data loader, a missing
data file…) turned into one line that names the task and where it failed: the CLI and the app never show a
traceback for a task folder's mistakes."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Sequence

from merging.common.errors import RamStudioError, first_line, printable


@contextlib.contextmanager
def task_errors(names: Sequence[str], doing: str):
    """An exception raised inside an lm-eval task (its process_results, its data loader, a missing data file…)
    becomes one RamStudioError naming the task and what failed, never a traceback."""
    try:
        yield
    except RamStudioError:  # ours (a cancel included) stays as it is
        raise
    except Exception as exc:  # noqa: BLE001 — whatever a task's own code or lm-eval raises
        task, where = failing_task(exc)
        name = task or ", ".join(names)
        raise RamStudioError(f"lm-eval task {printable(name, 80)} failed while {doing}{where}: "
                             f"{type(exc).__name__}: {first_line(exc, 200)}.",
                             "Check the task's files (its YAML, data files and Python in --include-path); "
                             "the demo's tasks show a working layout.") from None


def failing_task(exc: BaseException) -> tuple[str | None, str]:
    """The task whose code raised (from the traceback's frames: a lm-eval Task object or a task name among the
    locals, innermost first), and where (`in FUNCTION (FILE, line N)` of the innermost frame)."""
    from lm_eval.api.task import Task

    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    where = ""
    if frames:
        code = frames[-1].tb_frame.f_code
        where = f" in {code.co_name} ({Path(code.co_filename).name}, line {frames[-1].tb_lineno})"
    for tb in reversed(frames):
        local = tb.tb_frame.f_locals
        for key in ("task", "self", "task_obj"):
            obj = local.get(key)
            if isinstance(obj, Task):
                name = getattr(getattr(obj, "config", None), "task", None) or getattr(obj, "task_name", None)
                if isinstance(name, str):
                    return name, where
        for key in ("task_name", "name"):
            if isinstance(local.get(key), str) and "lm_eval" in tb.tb_frame.f_code.co_filename:
                return local[key], where
    return None, where

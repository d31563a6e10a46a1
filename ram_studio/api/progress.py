"""Progress of the Python API's long calls, one shape for all: `Progress(stage, done, total, text)` to a
callback, or tqdm bars (one per stage), or nothing."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Union

from merging.common.errors import RamStudioError


@dataclass(frozen=True)
class Progress:
    """Where a long call stands: `stage` (download, analyze, count, merge, evaluate, sweep, fig3), `done` of
    `total` units (bytes for reading stages, examples or scorings for scoring stages, percent for fig3), and a
    line of `text`."""

    stage: str
    done: float
    total: float
    text: str = ""

    @property
    def fraction(self) -> float:
        """The share done, 0 to 1."""
        return min(1.0, self.done / self.total) if self.total else 0.0


Sink = Callable[[Progress], None]
UNITS = {"download": "B", "analyze": "B", "count": "B", "merge": "B", "evaluate": "example", "sweep": "scoring",
         "fig3": "%"}
GROWING = {"sweep"}  # stages whose total grows while they run: their bar stays open until the call ends
ProgressArg = Union[bool, None, Sink]


class _Bars:
    """One tqdm bar per stage, closed when its stage is done (tqdm.auto's widget when ipywidgets is there)."""

    def __init__(self) -> None:
        self.bars: dict[str, Any] = {}
        self.lock = threading.Lock()

    @staticmethod
    def _tqdm():
        try:
            import ipywidgets  # noqa: F401 — tqdm.auto needs it in a notebook, else it warns and falls back
            from tqdm.auto import tqdm
        except ImportError:
            from tqdm import tqdm
        return tqdm

    def __call__(self, p: Progress) -> None:
        with self.lock:
            bar = self.bars.get(p.stage)
            if bar is None:
                unit = UNITS.get(p.stage, "")
                bar = self.bars[p.stage] = self._tqdm()(total=p.total or None, desc=p.stage, leave=True,
                                                        dynamic_ncols=True, unit=unit or "it", disable=False,
                                                        unit_scale=unit == "B", unit_divisor=1024)
            if p.total and bar.total != p.total:
                bar.total = p.total
            bar.n = p.done
            bar.set_postfix_str(p.text[:60], refresh=False)
            bar.refresh()
            if p.total and p.done >= p.total and p.stage not in GROWING:
                bar.close()
                del self.bars[p.stage]

    def close(self) -> None:
        """Close the bars still open (a stage whose total grows as it goes, e.g. a sweep's scorings)."""
        with self.lock:
            for bar in self.bars.values():
                bar.close()
            self.bars.clear()


def close(to: Sink | None) -> None:
    """The end of a call: bars still open are closed (a callback is left alone)."""
    if isinstance(to, _Bars):
        to.close()


def sink(progress: ProgressArg) -> Sink | None:
    """What `progress=` asks for: True → tqdm bars, False/None → nothing, a callable → it, with a Progress."""
    if progress is True:
        return _Bars()
    if progress is None or progress is False:
        return None
    if callable(progress):
        return progress
    raise RamStudioError(f"progress={progress!r} is neither True, False nor a function.",
                         "Pass progress=True for bars, False for none, or a function taking a Progress.")


def engine(to: Sink | None, stage: str):
    """An adapter for the engine's and the downloads' progress (bytes done of total, tensors or files)."""
    if to is None:
        return None

    def show(p) -> None:
        tensors = getattr(p, "tensors_total", None)
        text = f"tensors {p.tensors_done}/{tensors}" if tensors else getattr(p, "file", "") or ""
        to(Progress(stage, p.done, p.total, str(text)))

    return show


def examples(to: Sink | None, stage: str = "evaluate"):
    """An adapter for an evaluator's progress: (examples done, examples in all, what)."""
    return None if to is None else (lambda done, total, what: to(Progress(stage, done, total, what)))


def fraction(to: Sink | None, stage: str):
    """An adapter for a (fraction, text) step function, as the Fig. 3 experiment reports."""
    return None if to is None else (lambda f, text: to(Progress(stage, round(100 * f, 1), 100.0, text)))

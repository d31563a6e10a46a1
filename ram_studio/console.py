"""What every command shares on the terminal: escaped printing, tables, the progress line, and a stop flag that
SIGINT/SIGTERM set during a long pass."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator

from merging.common.errors import printable

QUIET_HELP = "no progress lines on stderr (results, warnings and errors are still printed)"


def say(text: object = "", file=None) -> None:
    """Print `text` (one or more lines) with every control character escaped in each line: no name, path or
    value read from a file or typed on the command line reaches the terminal raw."""
    print("\n".join(printable(line) for line in str(text).split("\n")), file=file)


def table(frame) -> str:
    """A data frame as text, with every control character in it escaped."""
    return frame.map(lambda v: printable(v, 120) if isinstance(v, str) else v).to_string(index=False)


def progress_printer(label: str):
    """A compact progress line on stderr: percent, bytes, tensors, ETA."""
    from merging.common.units import format_bytes, format_seconds

    tty = sys.stderr.isatty()

    def show(p) -> None:
        eta = f", ETA {format_seconds(p.eta)}" if p.eta is not None else ""
        line = (f"{label}: {100 * p.fraction:5.1f}%  {format_bytes(p.done)} of {format_bytes(p.total)}  "
                f"tensors {p.tensors_done}/{p.tensors_total}{eta}")
        if tty:
            sys.stderr.write("\r\033[K" + line)
            if p.done >= p.total:
                sys.stderr.write("\n")
        elif p.done >= p.total:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    return show


@contextlib.contextmanager
def stop_on_signal() -> Iterator[threading.Event]:
    """During a long pass, SIGINT/SIGTERM set a flag the engine polls between chunks, so the stop
    happens at a safe point (an exception raised inside a numba compile or a parallel kernel can
    leave the process hanging); a second signal interrupts at once."""
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt(f"signal {signum}")
        stop.set()

    if threading.current_thread() is not threading.main_thread():  # signals only reach the main thread
        yield stop
        return
    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)

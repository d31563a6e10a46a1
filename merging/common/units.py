"""Sizes and durations: parsing '5GB' and printing bytes and seconds the way people read them."""
from __future__ import annotations

import math
import re

from merging.common.errors import RamStudioError

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """'5GB', '500MB', '2GiB' or a byte count → bytes (decimal units like the Hub, binary for *iB)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE_RE.match(str(text)) if isinstance(text, str) else None
        if not m:
            raise RamStudioError(f"cannot read size {str(text)[:40]!r}.", "Use e.g. 5GB, 500MB or 2GiB.")
        base = 1024 if (m[3] or "").upper() == "IB" else 1000
        value = int(float(m[1]) * base ** " KMGT".index(m[2].upper() or " "))
    if value <= 0:
        raise RamStudioError(f"size {str(text)[:40]!r} must be positive.", "Use e.g. 5GB.")
    return value


def format_bytes(n: float) -> str:
    """Bytes with a unit that keeps 2-3 significant digits: 512 B, 1.4 KB, 630 KB, 3.09 GB."""
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB", "TB", "PB"):
        n /= 1000
        if n < 1000 or unit == "PB":
            return f"{n:.2f} {unit}" if n < 10 else (f"{n:.1f} {unit}" if n < 100 else f"{n:.0f} {unit}")
    return f"{n:.0f} PB"


def format_seconds(s: float | None) -> str:
    """A duration: '–', '< 1 s', '42 s', '1 min 30 s', '59 min 59 s', '1 h 0 min'."""
    if s is None or not math.isfinite(s):
        return "–"
    if s < 1:
        return "< 1 s"
    total = int(round(s))
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60} min {total % 60} s"
    minutes = total // 60
    return f"{minutes // 60} h {minutes % 60} min"

"""Sizes and durations as people read them (merging/common/units.py), used by the CLI and every app page."""
from __future__ import annotations

import pytest

from merging.common.errors import RamStudioError
from merging.common.units import format_bytes, format_seconds, parse_size


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (1, "1 B"), (999, "999 B"), (1000, "1.00 KB"), (1400, "1.40 KB"), (629_600, "630 KB"),
    (1_258_291, "1.26 MB"), (12_345_678, "12.3 MB"), (3_090_000_000, "3.09 GB"), (15.2e9, "15.2 GB"),
    (2.5e12, "2.50 TB"), (7e18, "7000 PB"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_format_bytes_never_reads_zero_for_something():
    """The issue's '0.00 GB' for small models: every positive size shows a non-zero number."""
    for n in (1, 37, 512, 1001, 5_000, 999_999, 1_000_001, 10**7 + 3):
        assert not format_bytes(n).startswith("0"), format_bytes(n)


@pytest.mark.parametrize("s, text", [
    (None, "–"), (float("nan"), "–"), (float("inf"), "–"), (0, "< 1 s"), (0.4, "< 1 s"), (1, "1 s"), (42.4, "42 s"),
    (59.4, "59 s"), (59.6, "1 min 0 s"), (60, "1 min 0 s"), (90, "1 min 30 s"), (150, "2 min 30 s"),
    (3599, "59 min 59 s"), (3600, "1 h 0 min"), (3661, "1 h 1 min"), (86399, "23 h 59 min"), (90000, "25 h 0 min"),
])
def test_format_seconds(s, text):
    assert format_seconds(s) == text


def test_format_seconds_is_monotonic():
    """Minutes and seconds never overflow (the old 90 s → '2 min 30 s', 3599 s → '60 min 59 s')."""
    def key(text: str) -> int:
        parts = text.split()
        if parts[-1] == "s" and len(parts) == 2:
            return int(parts[0])
        if parts[1] == "min":
            return 60 * int(parts[0]) + int(parts[2])
        return 3600 * int(parts[0]) + 60 * int(parts[2])

    values = [key(format_seconds(s)) for s in range(1, 7300)]
    assert values == sorted(values)
    assert all(abs(v - s) <= 59 for s, v in zip(range(1, 7300), values))


@pytest.mark.parametrize("text, n", [("5GB", 5_000_000_000), ("500MB", 500_000_000), ("2GiB", 2 * 1024**3),
                                     ("1.5 GB", 1_500_000_000), (123, 123), ("100", 100)])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "five", "-1GB", "0", 0, "1XB"])
def test_parse_size_refuses(text):
    with pytest.raises(RamStudioError):
        parse_size(text)

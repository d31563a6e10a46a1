"""Parsers for untrusted JSON and YAML (configs, indexes, safetensors headers, recipes, mergekit configs,
cache entries): bounded in size, nesting depth and expansion before any object is built, so a hostile file
gets one clear error instead of a RecursionError, a gigabyte of memory or a frozen server.

- JSON: the nesting depth is measured by a linear scan (strings skipped, brackets counted) before
  `json.loads` runs; deeper than MAX_DEPTH is refused.
- YAML: the event stream is read first: aliases (`*name`, the way a
  553-byte "billion laughs" document expands to gigabytes) are refused, and so are more than MAX_DEPTH
  levels, more than MAX_YAML_EVENTS events, or more than MAX_YAML_SECONDS of reading; only then is the
  document built with the safe loader (no tags that construct objects).
"""
from __future__ import annotations

import json
import re
import time
from typing import Any

import numpy as np

MAX_DEPTH = 64  # real configs, indexes, headers and recipes nest 2–6 levels
MAX_YAML_EVENTS = 20_000  # a mergekit config with 64 models is a few hundred events
MAX_YAML_SECONDS = 2.0

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BLOCK = 1 << 20


class TooComplex(ValueError):
    """Data that may be well-formed but exceeds a bound (depth, events, aliases, time); `reason` says which,
    in words that fit after a file's name ("is nested 100,000 levels deep …")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def json_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """The deepest nesting of arrays and objects in JSON `text` (strings skipped); stops counting once it
    passes `limit`. Linear in the length, and never recursive: brackets are counted first without telling
    strings apart (an upper bound, a fast C pass), and only when that passes `limit` again with strings
    removed."""
    deepest = _bracket_depth(text.encode("utf-8", "surrogatepass").translate(None, _OTHER_BYTES), limit)
    if deepest <= limit:
        return deepest
    return _bracket_depth(_JSON_STRING.sub("", text).encode("utf-8", "surrogatepass").translate(None, _OTHER_BYTES),
                          limit)


_OTHER_BYTES = bytes(b for b in range(256) if b not in b"[]{}")


def _bracket_depth(marks: bytes, limit: int) -> int:
    arr = np.frombuffer(marks, np.uint8)
    depth = deepest = 0
    for start in range(0, arr.size, _BLOCK):
        part = arr[start:start + _BLOCK]
        levels = depth + np.cumsum(np.where((part == 0x5B) | (part == 0x7B), 1, -1), dtype=np.int64)
        deepest = max(deepest, int(levels.max()))
        if deepest > limit:
            break
        depth = int(levels[-1])
    return deepest


def loads_json(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads(text)` after checking the nesting depth; raises TooComplex (too deep) or ValueError
    (not JSON, including numbers with more digits than Python converts)."""
    if json_depth(text, max_depth) > max_depth:
        raise TooComplex(f"is nested more than {max_depth} levels deep")
    try:
        return json.loads(text)
    except RecursionError:  # cannot happen below the depth limit; kept so that nothing escapes as a traceback
        raise TooComplex("is nested too deeply to read") from None


def loads_yaml(text: str, *, max_depth: int = MAX_DEPTH, max_events: int = MAX_YAML_EVENTS,
               max_seconds: float = MAX_YAML_SECONDS, tags: bool = True) -> Any:
    """A YAML document read with the safe loader, after its event stream passed the bounds above (and, with
    `tags` False, holding no explicit tag such as !!python/object). Raises TooComplex for a bound or a tag,
    `yaml.YAMLError` for malformed YAML, ValueError for an unconvertible scalar."""
    import yaml

    loader = yaml.SafeLoader  # the pure-Python loader: its error marks point at the line that opened a problem
    depth = events = 0
    start = time.monotonic()
    for event in yaml.parse(text, Loader=loader):
        events += 1
        if isinstance(event, yaml.AliasEvent):
            raise TooComplex(f"uses a YAML alias (*{_name(event.anchor)}, line {_line(event)}); aliases are not "
                             "read, since a few of them can expand a small file into gigabytes")
        if not tags and getattr(event, "tag", None) is not None and not isinstance(event, yaml.DocumentStartEvent):
            raise TooComplex(f"uses a YAML tag ({_name(event.tag)}, line {_line(event)}); tags are not read")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > max_depth:
                raise TooComplex(f"is nested more than {max_depth} levels deep (line {_line(event)})")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        if events > max_events:
            raise TooComplex(f"has more than {max_events:,} YAML nodes")
        if events % 512 == 0 and time.monotonic() - start > max_seconds:
            raise TooComplex(f"took more than {max_seconds:g} s to read")
    try:
        return yaml.load(text, Loader=loader)
    except (RecursionError, OverflowError) as exc:  # guarded above; never a traceback
        raise TooComplex(f"could not be read ({type(exc).__name__})") from None


def _line(event: Any) -> int:
    mark = getattr(event, "start_mark", None)
    return mark.line + 1 if mark is not None else 0


def _name(anchor: object) -> str:
    from merging.common.escaping import printable

    return printable(anchor, 40)

"""Strict reading of a safetensors file's header, so damaged files fail early with a clear message."""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from .dtypes import ITEMSIZE
from .errors import RamStudioError

# safetensors itself refuses headers above 100 MB; a larger claim means a damaged or hostile file.
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: its file, dtype code, shape and byte range inside the data section."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class FileHeader:
    """A parsed header: tensors by name, free-form metadata, file size and a hash of the header bytes."""

    path: Path
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    file_size: int
    header_sha256: str


def read_header(path: Path) -> FileHeader:
    """Parse and validate one .safetensors header without reading tensor data."""
    path = Path(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise _bad(path, f"is truncated ({size} bytes, shorter than the 8-byte header length)")
            n = int.from_bytes(prefix, "little")
            if n > MAX_HEADER_BYTES:
                raise _bad(path, f"claims a {n:,}-byte header (limit {MAX_HEADER_BYTES:,}); the file is damaged")
            if 8 + n > size:
                raise _bad(path, f"claims a {n:,}-byte header but the file has only {size:,} bytes; it is truncated")
            raw = f.read(n)
    except OSError as exc:
        raise RamStudioError(f"cannot read {path}: {exc.strerror or exc}.") from exc
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"has a header that is not valid JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise _bad(path, "has a header that is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise _bad(path, "has a __metadata__ entry that is not an object")
    data_size = size - 8 - n
    tensors: dict[str, TensorEntry] = {}
    for name, info in header.items():
        tensors[name] = _entry(path, name, info, data_size)
    _check_layout(path, tensors, data_size)
    return FileHeader(path, tensors, {str(k): str(v) for k, v in metadata.items()}, size,
                      hashlib.sha256(raw).hexdigest())


def _entry(path: Path, name: str, info: object, data_size: int) -> TensorEntry:
    """Validate one header entry: known dtype, integer shape, offsets that fit the data section."""
    if not isinstance(info, dict):
        raise _bad(path, f"has a malformed entry for tensor {name!r}")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in ITEMSIZE:
        raise _bad(path, f"stores tensor {name!r} with unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _bad(path, f"has an invalid shape {shape!r} for tensor {name!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets) or offsets[0] > offsets[1]):
        raise _bad(path, f"has invalid data offsets {offsets!r} for tensor {name!r}")
    begin, end = offsets
    if end > data_size:
        raise _bad(path, f"says tensor {name!r} ends at byte {end:,} of the data section, which has only "
                         f"{data_size:,} bytes; the file is truncated or damaged")
    expected = math.prod(shape) * ITEMSIZE[dtype]
    if end - begin != expected:
        raise _bad(path, f"gives tensor {name!r} {end - begin:,} bytes but its shape {shape} and dtype "
                         f"{dtype} need {expected:,}")
    return TensorEntry(name, path, dtype, tuple(shape), begin, end)


def _check_layout(path: Path, tensors: dict[str, TensorEntry], data_size: int) -> None:
    """Tensors must not overlap (safetensors' own rule); overlapping ranges mean a forged header."""
    spans = sorted((e.begin, e.end, e.name) for e in tensors.values() if e.end > e.begin)
    for (b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise _bad(path, f"has overlapping tensors {n0!r} and {n1!r}")


def _bad(path: Path, what: str) -> RamStudioError:
    return RamStudioError(
        f"{path} {what}.",
        "Re-download or re-export this file (for a Hub model: delete it from the cache and download again).",
    )

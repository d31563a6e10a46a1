"""Strict reading of a safetensors file's header, so damaged or hostile files fail early with a clear message.

The rules are those the safetensors library enforces when it opens a file (a JSON object of string
metadata and tensor entries; integer shapes; tensors that tile the data section from byte 0 to the end
of the file with no gap or overlap), checked here first so that no file that passes can make it fail
later. Error messages name the file and tensor but never echo bytes of the file.
"""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

from merging.common.dtypes import ITEMSIZE
from merging.common.errors import RamStudioError, printable
from merging.common.untrusted import TooComplex, loads_json

# safetensors itself refuses headers above 100 MB; a larger claim means a damaged or hostile file.
MAX_HEADER_BYTES = 100_000_000
HEADER_DEPTH = 8  # a header nests 3 levels: {name: {"shape": [...]}}
MAX_DIM = 1 << 48  # no real tensor dimension comes near this; it keeps every size far inside int64
_CODES = {code: code for code in ITEMSIZE}


@dataclass(frozen=True, slots=True)  # slots: a model with 100,000 tensors holds 100,000 of these
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
                raise _bad(path, f"is truncated ({size:,} bytes, shorter than the 8-byte header length)")
            n = int.from_bytes(prefix, "little")
            if n > MAX_HEADER_BYTES:
                raise _bad(path, f"claims a header larger than the {MAX_HEADER_BYTES:,}-byte limit; it is damaged "
                                 "or not a safetensors file")
            if 8 + n > size:
                raise _bad(path, "claims a header longer than the file; it is truncated or not a safetensors file")
            raw = f.read(n)
    except OSError as exc:
        raise RamStudioError(f"cannot read {path}: {exc.strerror or exc}.") from exc
    try:
        header = loads_json(raw.decode("utf-8"), max_depth=HEADER_DEPTH)
    except TooComplex as exc:
        raise _bad(path, f"has a header that {exc.reason}") from None
    except (UnicodeDecodeError, ValueError):
        raise _bad(path, "has a header that is not valid JSON (UTF-8)") from None
    if not isinstance(header, dict):
        raise _bad(path, "has a header that is not a JSON object")
    metadata = header.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata  # null is allowed; [], "" or 0 are not (as in safetensors)
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise _bad(path, "has __metadata__ that is not an object of strings")
    data_size = size - 8 - n
    tensors = {name: _entry(path, name, info, data_size) for name, info in header.items()}
    _check_layout(path, tensors, data_size)
    return FileHeader(path, tensors, metadata, size, hashlib.sha256(raw).hexdigest())


def _entry(path: Path, name: str, info: object, data_size: int) -> TensorEntry:
    """Validate one header entry: known dtype, integer shape, offsets that fit the data section. The usual case is
    checked in a few operations (a header may list 100,000 tensors); anything else is diagnosed by `_bad_entry`."""
    if type(info) is dict and len(info) == 3 and name:
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        dtype = _CODES.get(dtype) if type(dtype) is str else None  # one string object per dtype, not per tensor
        if dtype is not None and type(shape) is list and type(offsets) is list and len(offsets) == 2:
            begin, end = offsets
            n = 1
            for d in shape:
                if type(d) is not int or not 0 <= d < MAX_DIM:
                    break
                n *= d
            else:
                if type(begin) is int and type(end) is int and 0 <= begin <= end <= data_size and n < MAX_DIM \
                        and end - begin == n * ITEMSIZE[dtype]:
                    return TensorEntry(name, path, dtype, tuple(shape), begin, end)
    return _bad_entry(path, name, info, data_size)


def _bad_entry(path: Path, name: str, info: object, data_size: int) -> TensorEntry:
    """The entry `_entry`'s quick check did not pass: the full checks, each with its message."""
    shown = printable(name, 120)
    if not name or not isinstance(info, dict) or set(info) - {"dtype", "shape", "data_offsets"}:
        raise _bad(path, f"has a malformed entry for tensor {shown!r}")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise _bad(path, f"stores tensor {shown!r} with an unsupported dtype")
    if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < MAX_DIM for d in shape) \
            or math.prod(shape) >= MAX_DIM:
        raise _bad(path, f"has an invalid shape for tensor {shown!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(o) is int and o >= 0 for o in offsets) or offsets[0] > offsets[1]):
        raise _bad(path, f"has invalid data offsets for tensor {shown!r}")
    begin, end = offsets
    if end > data_size:
        raise _bad(path, f"says tensor {shown!r} ends at byte {end:,} of the data section, which has only "
                         f"{data_size:,} bytes; the file is truncated or damaged")
    expected = math.prod(shape) * ITEMSIZE[dtype]
    if end - begin != expected:
        raise _bad(path, f"gives tensor {shown!r} {end - begin:,} bytes but its shape {shape} and dtype "
                         f"{dtype} need {expected:,}")
    return TensorEntry(name, path, dtype, tuple(shape), begin, end)


def _check_layout(path: Path, tensors: dict[str, TensorEntry], data_size: int) -> None:
    """Tensors must tile the data section exactly, in offset order (the safetensors library's own rule):
    a gap, an overlap or trailing bytes mean a damaged or forged file."""
    pos = 0
    for begin, end, name in sorted((e.begin, e.end, e.name) for e in tensors.values()):
        if begin < pos:
            raise _bad(path, f"has overlapping tensors (at {printable(name, 120)!r})")
        if begin > pos:
            raise _bad(path, f"has a gap of {begin - pos:,} bytes before tensor {printable(name, 120)!r}")
        pos = end
    if pos != data_size:
        raise _bad(path, f"has {data_size - pos:,} bytes after its last tensor")


def _bad(path: Path, what: str) -> RamStudioError:
    return RamStudioError(
        f"{path} {what}.",
        "Re-download or re-export this file (for a Hub model: delete it from the cache and download again).",
    )

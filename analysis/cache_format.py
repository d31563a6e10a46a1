"""The analysis cache entry's bytes: a JSON header, then the columns of the frames and the arrays, raw.

Layout: MAGIC, the header's length (8 bytes, little endian), the header (UTF-8 JSON: the scalar fields, and for
each table its row count and columns), then each column's values at the offset the header gives, aligned to 8
bytes. A numeric column is stored as is (little-endian int64, int32, float64 or bool); a text column as the
list of its distinct values (in the header) and one int32 code per row. Nothing is executed or unpickled on
reading: the header is parsed by the bounded JSON reader, every dtype is one of a fixed set, every offset,
length and code is checked against the entry's size and the table's row count, and anything else makes the
entry unreadable (the caller rebuilds it). Reading a 100,000-tensor analysis takes a fraction of a second
where a JSON document of its rows took minutes and gigabytes.
"""
from __future__ import annotations

import json
import struct
from typing import TYPE_CHECKING

import numpy as np

from merging.common.untrusted import loads_json

if TYPE_CHECKING:
    import pandas as pd

MAGIC = b"RAM-STUDIO-ANALYSIS\x00"
DTYPES = {"<i8": np.int64, "<i4": np.int32, "<f8": np.float64, "|b1": np.bool_}
MAX_HEADER = 256 << 20


def encode(meta: dict, tables: dict[str, "pd.DataFrame"], arrays: dict[str, np.ndarray]) -> list:
    """The entry's bytes for `meta` (JSON values), `tables` (frames) and `arrays` (numeric numpy arrays), as a list
    of pieces to write one after the other (the arrays' own memory where it can be: no copy of the entry)."""
    chunks: list = []
    size = 0

    def put(values: np.ndarray) -> dict:
        nonlocal size
        data = np.ascontiguousarray(values)
        spec = {"dtype": data.dtype.str, "offset": size, "shape": list(values.shape)}
        chunks.append(memoryview(data.reshape(-1)).cast("B") if data.size else b"")
        pad = -data.nbytes % 8
        if pad:
            chunks.append(b"\0" * pad)
        size += data.nbytes + pad
        return spec

    header = {"meta": meta, "tables": {}, "arrays": {k: put(_little(v)) for k, v in arrays.items()}}
    for name, frame in tables.items():
        cols = []
        for c in frame.columns:
            cols.append({"name": str(c), **_column(frame[c], put)})
        header["tables"][name] = {"rows": len(frame), "columns": cols}
    head = json.dumps(header).encode()
    pad = b"\0" * (-(len(MAGIC) + 8 + len(head)) % 8)
    return [MAGIC, struct.pack("<Q", len(head) + len(pad)), head, pad, *chunks]


def _little(values: np.ndarray) -> np.ndarray:
    """The array in one of DTYPES, little endian (a view when it already is)."""
    if values.dtype == np.bool_:
        return values
    want = "<f8" if values.dtype.kind == "f" else "<i4" if values.dtype == np.int32 else "<i8"
    return np.asarray(values, dtype=want)


def _column(col: "pd.Series", put) -> dict:
    """How one frame column is stored (see the module docstring)."""
    import pandas as pd

    kind = col.dtype.kind if isinstance(col.dtype, np.dtype) else ""
    if kind in ("i", "u", "f", "b"):
        return {"kind": "array", **put(_little(col.to_numpy()))}
    codes, uniques = pd.factorize(col, use_na_sentinel=False)
    values = [v if isinstance(v, str) else int(v) for v in uniques.tolist()]
    if not all(isinstance(v, str) for v in values) and not all(type(v) is int for v in values):
        raise TypeError(f"column {col.name!r} mixes text and numbers")
    return {"kind": "text" if all(isinstance(v, str) for v in values) else "ints", "values":
            values if all(isinstance(v, str) for v in values) else [str(v) for v in values],
            **put(np.asarray(codes, dtype="<i4"))}


def decode(data: bytes) -> tuple[dict, dict[str, "pd.DataFrame"], dict[str, np.ndarray]]:
    """(meta, tables, arrays) from an entry's bytes; ValueError when anything does not fit."""
    import pandas as pd

    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        raise ValueError("not an analysis cache entry")
    (length,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8 + length
    if length > MAX_HEADER or start > len(data):
        raise ValueError("bad header length")
    header = loads_json(data[len(MAGIC) + 8:start].rstrip(b"\0").decode("utf-8"))
    if not isinstance(header, dict) or not isinstance(header.get("meta"), dict):
        raise ValueError("bad header")
    body = memoryview(data)[start:]
    arrays = {str(k): _array(body, spec, None) for k, spec in _items(header.get("arrays"))}
    tables = {}
    for name, spec in _items(header.get("tables")):
        rows = spec.get("rows") if isinstance(spec, dict) else None
        if not isinstance(rows, int) or rows < 0 or not isinstance(spec.get("columns"), list):
            raise ValueError("bad table")
        cols = {}
        for c in spec["columns"]:
            if not isinstance(c, dict) or not isinstance(c.get("name"), str) or c["name"] in cols:
                raise ValueError("bad column")
            cols[c["name"]] = _column_values(body, c, rows)
        tables[str(name)] = pd.DataFrame(cols, copy=False) if cols else pd.DataFrame(index=range(rows))
    return header["meta"], tables, arrays


def _items(x) -> list:
    if not isinstance(x, dict):
        raise ValueError("bad header")
    return list(x.items())


def _column_values(body: memoryview, spec: dict, rows: int) -> np.ndarray:
    """One column's values, checked: `rows` of them; text codes within the list of values."""
    kind = spec.get("kind")
    values = _array(body, spec, (rows,))
    if kind == "array":
        return values
    if kind not in ("text", "ints") or values.dtype != np.int32 or not isinstance(spec.get("values"), list):
        raise ValueError("bad column kind")
    words = spec["values"]
    if not all(isinstance(w, str) for w in words):
        raise ValueError("bad column values")
    if rows and (int(values.min()) < 0 or int(values.max()) >= len(words)):
        raise ValueError("column code out of range")
    table = np.empty(len(words), dtype=object)
    table[:] = words if kind == "text" else [int(w) for w in words]
    return table[values] if rows else np.empty(0, dtype=object)


def _array(body: memoryview, spec, shape: tuple[int, ...] | None) -> np.ndarray:
    """An array at the spec's offset, of its dtype and shape (which must be `shape` when given), copied out."""
    if not isinstance(spec, dict) or spec.get("dtype") not in DTYPES or not isinstance(spec.get("offset"), int) \
            or not isinstance(spec.get("shape"), list) or not all(isinstance(d, int) and d >= 0 for d in spec["shape"]):
        raise ValueError("bad array spec")
    dims = tuple(spec["shape"])
    if shape is not None and dims != shape:
        raise ValueError("array of the wrong shape")
    dtype = np.dtype(DTYPES[spec["dtype"]]).newbyteorder("<") if spec["dtype"] != "|b1" else np.dtype(np.bool_)
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    lo, hi = spec["offset"], spec["offset"] + count * dtype.itemsize
    if lo < 0 or hi > len(body):
        raise ValueError("array beyond the entry")
    return np.frombuffer(body[lo:hi], dtype=dtype).reshape(dims).astype(dtype.newbyteorder("="), copy=True)

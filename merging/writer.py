"""Streaming safetensors writer: shard layout and headers are fixed up front, tensor bytes are appended.

Writing our own header lets us stream a multi-GB shard without holding it in memory; the files are
plain safetensors (8-byte little-endian header length, JSON header padded to 8 bytes, raw data) and
are read back with `safetensors.safe_open` and `transformers` in the tests.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from .dtypes import ITEMSIZE

@dataclass(frozen=True)
class PlannedTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


def plan_shards(tensors: list[PlannedTensor], max_bytes: int) -> list[list[PlannedTensor]]:
    """Group tensors, in order, into shards of at most `max_bytes` (a larger tensor gets its own shard)."""
    shards: list[list[PlannedTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def shard_names(count: int) -> list[str]:
    """Hugging Face shard names: model.safetensors, or model-0000k-of-0000n.safetensors."""
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def encode_header(tensors: list[PlannedTensor], metadata: dict[str, str]) -> bytes:
    """The 8-byte length plus JSON header (padded with spaces to a multiple of 8) for these tensors."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % 8)
    return len(raw).to_bytes(8, "little") + raw


class ShardSetWriter:
    """Writes planned shards into `folder`, tensor after tensor, checking every byte count."""

    def __init__(self, folder: Path, shards: list[list[PlannedTensor]], metadata: dict[str, str]) -> None:
        self.folder = folder
        self.shards = shards
        self.names = shard_names(len(shards))
        self.metadata = metadata
        self._order = [(i, t) for i, shard in enumerate(shards) for t in shard]
        self._pos = -1
        self._left = 0
        self._file = None
        self._shard = -1

    def begin(self, name: str) -> None:
        """Start the next tensor; names must come in planned order."""
        if self._left:
            raise RuntimeError(f"tensor {self._order[self._pos][1].name} is incomplete")
        self._pos += 1
        shard, t = self._order[self._pos]
        if t.name != name:
            raise RuntimeError(f"expected tensor {t.name}, got {name}")
        if shard != self._shard:
            self._close_file()
            self._shard = shard
            self._file = open(self.folder / self.names[shard], "wb")
            self._file.write(encode_header(self.shards[shard], self.metadata))
        self._left = t.nbytes

    def write(self, data: memoryview | bytes) -> None:
        n = memoryview(data).nbytes
        if n > self._left:
            raise RuntimeError("more bytes than the tensor holds")
        self._file.write(data)
        self._left -= n

    def finish(self) -> dict:
        """Close the last shard and return the index (`metadata.total_size`, `weight_map`)."""
        if self._left or self._pos != len(self._order) - 1:
            raise RuntimeError("not every planned tensor was written")
        self._close_file()
        return {
            "metadata": {"total_size": sum(t.nbytes for s in self.shards for t in s)},
            "weight_map": {t.name: self.names[i] for i, t in self._order},
        }

    def abort(self) -> None:
        self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())  # the final rename must never expose unflushed data
            self._file.close()
            self._file = None

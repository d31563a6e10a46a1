"""Streaming safetensors writer: shard layout and headers are fixed up front, tensor bytes are appended.

Writing our own header lets us stream a multi-GB shard without holding it in memory; the files are
plain safetensors (8-byte little-endian header length, JSON header padded to 8 bytes, raw data) and
are read back with `safetensors.safe_open` and `transformers` in the tests.
"""
from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from merging.common.dtypes import ITEMSIZE


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
    """Writes planned shards into `folder`. The layout is fixed before the first byte, so every chunk is
    written at its own offset (`write_at`, from any thread, in any order); `begin`/`write` append tensor
    after tensor. Every byte count is checked, and `finish` fsyncs each shard."""

    def __init__(self, folder: Path, shards: list[list[PlannedTensor]], metadata: dict[str, str]) -> None:
        self.folder = folder
        self.shards = shards
        self.names = shard_names(len(shards))
        self.metadata = metadata
        self._order = [(i, t) for i, shard in enumerate(shards) for t in shard]
        self._headers = [encode_header(s, metadata) for s in shards]
        self._where: dict[str, tuple[int, int, int]] = {}  # name → (shard, file offset of its data, nbytes)
        for i, shard in enumerate(shards):
            pos = len(self._headers[i])
            for t in shard:
                self._where[t.name] = (i, pos, t.nbytes)
                pos += t.nbytes
        self._written: dict[str, int] = {}
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        self._pos = -1  # sequential API: index into _order, and bytes written of that tensor
        self._done = 0

    def _fd(self, shard: int) -> int:
        with self._lock:
            fd = self._fds.get(shard)
            if fd is None:
                fd = os.open(self.folder / self.names[shard], os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                             | getattr(os, "O_CLOEXEC", 0), 0o644)
                self._fds[shard] = fd
                _pwrite_all(fd, memoryview(self._headers[shard]), 0)
            return fd

    def write_at(self, name: str, byte_offset: int, data: memoryview | bytes, rewrite: bool = False) -> None:
        """Write bytes of tensor `name` starting `byte_offset` bytes into its data; `rewrite` replaces bytes
        written before (not counted again: e.g. an added token's row inside the base's vocabulary)."""
        shard, start, nbytes = self._where[name]
        view = memoryview(data).cast("B")
        if byte_offset < 0 or byte_offset + view.nbytes > nbytes:
            raise RuntimeError(f"bytes {byte_offset}..{byte_offset + view.nbytes} are outside tensor {name}")
        fd = self._fd(shard)
        _pwrite_all(fd, view, start + byte_offset)
        _start_writeback(fd, start + byte_offset, view.nbytes)
        if rewrite:
            return
        with self._lock:
            self._written[name] = self._written.get(name, 0) + view.nbytes

    def begin(self, name: str) -> None:
        """Start the next tensor; names must come in planned order."""
        if self._pos >= 0 and self._done != self._order[self._pos][1].nbytes:
            raise RuntimeError(f"tensor {self._order[self._pos][1].name} is incomplete")
        self._pos += 1
        t = self._order[self._pos][1]
        if t.name != name:
            raise RuntimeError(f"expected tensor {t.name}, got {name}")
        self._done = 0
        if t.nbytes == 0:
            self._fd(self._order[self._pos][0])

    def write(self, data: memoryview | bytes) -> None:
        """Append bytes to the tensor begun last."""
        t = self._order[self._pos][1]
        n = memoryview(data).nbytes
        if self._done + n > t.nbytes:
            raise RuntimeError("more bytes than the tensor holds")
        self.write_at(t.name, self._done, data)
        self._done += n

    def finish(self) -> dict:
        """Check every tensor is complete, fsync and close the shards, and return the index
        (`metadata.total_size`, `weight_map`)."""
        missing = [t.name for _, t in self._order if self._written.get(t.name, 0) != t.nbytes and t.nbytes]
        if missing:
            raise RuntimeError(f"not every planned tensor was written (first: {missing[0]})")
        for i in range(len(self.shards)):
            self._fd(i)  # a shard of empty tensors still needs its header
        self._close(sync=True)
        return {
            "metadata": {"total_size": sum(t.nbytes for s in self.shards for t in s)},
            "weight_map": {t.name: self.names[i] for i, t in self._order},
        }

    def abort(self) -> None:
        self._close(sync=False)

    def _close(self, sync: bool) -> None:
        with self._lock:
            fds, self._fds = self._fds, {}
        try:
            for fd in fds.values():
                if sync:
                    os.fsync(fd)  # the final rename must never expose unflushed data
        finally:
            for fd in fds.values():
                os.close(fd)


def _pwrite_all(fd: int, view: memoryview, pos: int) -> None:
    done = 0
    while done < view.nbytes:
        done += os.pwritev(fd, [view[done:]], pos + done)


def _load_sync_file_range():
    """libc's sync_file_range (Linux), to start writing dirty pages back early; None elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        return fn
    except (OSError, AttributeError):
        return None


_SYNC_FILE_RANGE = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def _start_writeback(fd: int, pos: int, nbytes: int) -> None:
    """Ask the kernel to start writing these bytes to disk now (without waiting), so that the final
    fsync finds little left to do: the disk writes overlap the rest of the merge."""
    if _SYNC_FILE_RANGE is not None and nbytes >= (1 << 20):
        _SYNC_FILE_RANGE(fd, pos, nbytes, _SYNC_FILE_RANGE_WRITE)

"""Stream sharded bf16 safetensors to disk tensor by tensor, so memory stays at one chunk."""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from typing import BinaryIO, Optional

BYTES_PER_ELEMENT = 2  # bf16


def parse_size(text: str) -> int:
    """Parse '2GB', '500MB', '1.5GiB' or a plain byte count into bytes."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?i?B?)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"bad size {text!r}")
    unit = (m.group(2) or "").upper().rstrip("B")
    powers = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}
    base = 1024 if unit.endswith("I") else 1000
    return int(float(m.group(1)) * base ** powers[unit.rstrip("I")])


@dataclass
class ShardPlan:
    """Which tensors go into which shard, with byte offsets, decided before writing."""

    shards: list[list[tuple[str, tuple[int, ...]]]] = field(default_factory=list)

    @classmethod
    def build(cls, specs: list[tuple[str, tuple[int, ...]]], shard_bytes: int) -> "ShardPlan":
        """Greedy split in the given order; a new shard starts when the next tensor would overflow."""
        plan, current, size = cls(), [], 0
        for name, dims in specs:
            nbytes = _numel(dims) * BYTES_PER_ELEMENT
            if current and size + nbytes > shard_bytes:
                plan.shards.append(current)
                current, size = [], 0
            current.append((name, dims))
            size += nbytes
        if current:
            plan.shards.append(current)
        return plan

    def file_name(self, index: int) -> str:
        """HF shard file name for shard `index` (0-based)."""
        return f"model-{index + 1:05d}-of-{len(self.shards):05d}.safetensors"

    def header(self, index: int) -> bytes:
        """Length-prefixed JSON header of shard `index`, padded to 8 bytes as safetensors does."""
        meta: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dims in self.shards[index]:
            end = offset + _numel(dims) * BYTES_PER_ELEMENT
            meta[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, end]}
            offset = end
        raw = json.dumps(meta, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", len(raw)) + raw

    def index_json(self) -> dict:
        """model.safetensors.index.json content (total_size and weight_map)."""
        weight_map, total = {}, 0
        for i, shard in enumerate(self.shards):
            for name, dims in shard:
                weight_map[name] = self.file_name(i)
                total += _numel(dims) * BYTES_PER_ELEMENT
        return {"metadata": {"total_size": total}, "weight_map": weight_map}


class StreamingCheckpointWriter:
    """Writes one model's shards sequentially; tensors must arrive in plan order, in chunks."""

    def __init__(self, out_dir: str, plan: ShardPlan) -> None:
        """Prepare writing into out_dir (created if missing)."""
        self.out_dir, self.plan = out_dir, plan
        os.makedirs(out_dir, exist_ok=True)
        self._order = [(i, name, dims) for i, s in enumerate(plan.shards) for name, dims in s]
        self._pos = -1
        self._file: Optional[BinaryIO] = None
        self._shard = -1
        self._remaining = 0

    def begin_tensor(self, name: str) -> None:
        """Start the next tensor; opens the next shard file when needed."""
        if self._remaining:
            raise RuntimeError(f"previous tensor incomplete ({self._remaining} bytes missing)")
        self._pos += 1
        shard, expected, dims = self._order[self._pos]
        if name != expected:
            raise RuntimeError(f"tensor order mismatch: got {name}, plan has {expected}")
        if shard != self._shard:
            self._close_file()
            self._shard = shard
            self._file = open(os.path.join(self.out_dir, self.plan.file_name(shard)), "wb")
            self._file.write(self.plan.header(shard))
        self._remaining = _numel(dims) * BYTES_PER_ELEMENT

    def write(self, data: memoryview | bytes) -> None:
        """Append raw little-endian bf16 bytes of the current tensor."""
        n = len(memoryview(data).cast("B"))
        if n > self._remaining:
            raise RuntimeError("more bytes than the tensor holds")
        assert self._file is not None
        self._file.write(data)
        self._remaining -= n

    def finish(self, config: dict) -> None:
        """Close the last shard and write the index and config.json."""
        if self._remaining or self._pos != len(self._order) - 1:
            raise RuntimeError("checkpoint incomplete")
        self._close_file()
        with open(os.path.join(self.out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(self.plan.index_json(), f, indent=2)
        with open(os.path.join(self.out_dir, "config.json"), "w") as f:
            json.dump(config, f, indent=2)

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n

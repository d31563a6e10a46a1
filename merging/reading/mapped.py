"""An agent checkpoint seen in the base's layout (merging/reading/layout.py): the same files, read through a map.

`MappedCheckpoint.tensors` lists the base's names for mapped tensors (`MappedEntry`: dtype, shape and the stored
pieces that make them) and the agent's own names for the rest, so every pass, the engine and the fingerprints
work on it as on the base. A chunk of a mapped tensor is read piece by piece straight into the reader's buffer
(merging/reading/chunks.py); `read` assembles rows for the few whole-tensor reads (fingerprint completion,
loading a model for evaluation), one source slice at a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

import torch

from merging.common.dtypes import ITEMSIZE, ST_TO_TORCH
from merging.reading.checkpoint import Checkpoint
from merging.reading.layout import LayoutMap
from merging.reading.safetensors_header import FileHeader, TensorEntry


@dataclass(frozen=True, slots=True)
class MappedEntry:
    """A tensor in the base's layout made of stored pieces: (stored entry, first element here, first element
    in the stored tensor, elements), in order."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    pieces: tuple[tuple[TensorEntry, int, int, int], ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]

    def byte_pieces(self, byte_start: int, nbytes: int) -> Iterator[tuple[TensorEntry, int, int, int]]:
        """For bytes [byte_start, byte_start + nbytes) of this tensor: (stored entry, offset in those bytes,
        byte offset inside the stored tensor, bytes), in order."""
        size = ITEMSIZE[self.dtype]
        lo, hi = byte_start, byte_start + nbytes
        for entry, start, src, count in self.pieces:
            a, b = max(lo, start * size), min(hi, (start + count) * size)
            if a < b:
                yield entry, a - lo, src * size + a - start * size, b - a


@dataclass
class MappedCheckpoint(Checkpoint):
    """An agent read in the base's layout; `stored` is its own tensor table, `layout` the map applied."""

    stored: dict[str, TensorEntry] = field(default_factory=dict)
    layout: LayoutMap | None = None

    def read(self, name: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        """Tensor `name` of the view (rows start:stop when given), in its stored dtype."""
        entry = self.tensors[name]
        if not isinstance(entry, MappedEntry):
            return self._read_entry(entry, start, stop)
        rows = entry.shape[0] if entry.shape else 1
        start, stop = (0, rows) if start is None or not entry.shape else (start, min(stop, rows))
        row = math.prod(entry.shape[1:]) if entry.shape else 1
        out = torch.empty((stop - start) * row, dtype=ST_TO_TORCH[entry.dtype])
        size = ITEMSIZE[entry.dtype]
        for src, at, byte, nbytes in entry.byte_pieces(start * row * size, (stop - start) * row * size):
            first, count = byte // size, nbytes // size
            src_row = math.prod(src.shape[1:]) if len(src.shape) > 1 else 1
            r0, r1 = first // src_row, -(-(first + count) // src_row)
            part = self._read_entry(src, r0, r1).reshape(-1)
            out[at // size:at // size + count] = part[first - r0 * src_row:first - r0 * src_row + count]
        return out.view(stop - start, *entry.shape[1:]) if entry.shape else out.view(())

    def names_in_file(self, header: FileHeader) -> list[str]:
        """The view's tensors whose data starts in this file, in file order."""
        def first(e) -> tuple[int, int]:
            return (e.pieces[0][0].begin, e.pieces[0][2]) if isinstance(e, MappedEntry) else (e.begin, 0)

        def file_of(e) -> object:
            return e.pieces[0][0].file if isinstance(e, MappedEntry) else e.file

        return [e.name for e in sorted((e for e in self.tensors.values() if file_of(e) == header.path), key=first)]


def with_layout(ckpt: Checkpoint, layout: LayoutMap | None) -> Checkpoint:
    """`ckpt` read through `layout` (itself when there is nothing to map)."""
    if layout is None or not layout.sources:
        return ckpt
    stored = ckpt.tensors
    view: dict[str, TensorEntry | MappedEntry] = {}
    for name, src in layout.sources.items():
        pieces = tuple((stored[b.source], b.start, b.source_start, b.count) for b in src.blocks)
        view[name] = MappedEntry(name, src.dtype, src.shape, pieces)
    view.update({n: e for n, e in stored.items() if n not in layout.consumed})
    return MappedCheckpoint(ckpt.ref, ckpt.folder, ckpt.headers, view, ckpt.config, stored=stored, layout=layout)

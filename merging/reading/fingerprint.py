"""Content fingerprints of input files, computed from the bytes the streaming read already fetches.

Every tensor's stored bytes are hashed (xxh3-128, fast and non-cryptographic: it identifies content,
it does not authenticate it) in row order as the reader returns them; whatever a pass did not read
(rows an agent has beyond the base, tensors the merge drops, integer buffers the analysis skips) is
read once at the end. A file's fingerprint covers its header and every tensor; a model's weights
fingerprint covers its tensors' names and bytes only, so two byte-identical agents are recognised even
when their metadata differ.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
import xxhash

from merging.common.errors import RamStudioError
from merging.reading.checkpoint import Checkpoint

READ_ROWS_BYTES = 64 << 20  # rows read at a time when finishing a tensor the pass did not read


@dataclass
class _TensorHash:
    hasher: "xxhash.xxh3_128 | None"
    next_row: int = 0
    digest: bytes | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class Fingerprinter:
    """Hashes the stored bytes of each model's tensors as they are read; `finish` completes and reports."""

    def __init__(self, models: list[Checkpoint]) -> None:
        self.models = models
        self._state: list[dict[str, _TensorHash]] = [{} for _ in models]
        self._whole: list[dict[str, bytes]] = [{} for _ in models]  # digests of tensors hashed at once
        self._lock = threading.Lock()

    def add(self, model: int, tensor: str, start_row: int, data: torch.Tensor) -> None:
        """Hash rows [start_row, start_row + len) of a tensor, if they are the next unhashed rows."""
        shape = self.models[model].tensors[tensor].shape
        rows = data.shape[0] if (len(shape) > 0 and data.dim() > 0) else 1
        self.add_bytes(model, tensor, start_row, rows, data)

    def add_bytes(self, model: int, tensor: str, start_row: int, rows: int, data: torch.Tensor | memoryview) -> None:
        """Hash `data` (the stored bytes of `rows` rows from `start_row`), if they are the next unhashed rows.

        Only the lookup is under the shared lock: different models are hashed by different reader
        threads at once, each model's rows in order."""
        with self._lock:
            if tensor in self._whole[model]:
                return
            st = self._state[model].get(tensor)
            if st is None:
                st = self._state[model][tensor] = _TensorHash(xxhash.xxh3_128())
        with st.lock:
            if st.digest is not None or start_row != st.next_row:
                return  # already hashed (a later pass over the same rows)
            st.hasher.update(_bytes(data))
            shape = self.models[model].tensors[tensor].shape
            st.next_row += rows
            if st.next_row >= (shape[0] if shape else 1):
                st.digest = st.hasher.digest()
                st.hasher = None  # ~600 bytes of hasher state per tensor and model, no longer needed

    def add_tensors(self, model: int, tensors: list[tuple[str, memoryview]]) -> None:
        """Hash whole tensors at once (name, all of its stored bytes), as a batch of small tensors is read; a
        tensor already hashed (or being hashed row by row) is left as it is."""
        digests = {name: xxhash.xxh3_128_digest(data) for name, data in tensors}
        with self._lock:
            state, whole = self._state[model], self._whole[model]
            for name, digest in digests.items():
                if name not in state:
                    whole.setdefault(name, digest)

    def finish(self) -> list[dict]:
        """Per model: {"weights_xxh3_128", "files": {file name: xxh3_128 of header + tensors}}."""
        out = []
        for i, ckpt in enumerate(self.models):
            # Stored tensors only: a view's second name for one stored tensor is not part of the content.
            whole = self._whole[i]
            digests = {name: whole[name] if name in whole else self._complete(i, ckpt, name)
                       for name, e in ckpt.tensors.items() if e.name == name}
            # One hash of the concatenation: the same digest as updating name by name.
            weights = xxhash.xxh3_128(b"".join(name.encode() + b"\0" + digests[name] for name in sorted(digests)))
            files = {}
            for h in ckpt.headers:
                f = xxhash.xxh3_128(bytes.fromhex(h.header_sha256))
                f.update(b"".join(name.encode() + b"\0" + digests[name] for name in ckpt.names_in_file(h)))
                files[h.path.name] = f.hexdigest()
            out.append({"weights_xxh3_128": weights.hexdigest(), "files": files})
            ckpt.release()  # unmap whatever finishing had to read
        return out

    def _complete(self, model: int, ckpt: Checkpoint, name: str) -> bytes:
        st = self._state[model].get(name)
        if st is None:
            st = self._state[model][name] = _TensorHash(xxhash.xxh3_128())
        if st.digest is not None:
            return st.digest
        entry = ckpt.tensors[name]
        if not entry.shape:
            self.add(model, name, 0, ckpt.read(name))
        else:
            rows = entry.shape[0]
            per = max(1, READ_ROWS_BYTES // max(1, entry.nbytes // max(1, rows)))
            for start in range(st.next_row, rows, per):
                self.add(model, name, start, ckpt.read(name, start, min(start + per, rows)))
            if rows == 0:
                st.digest = st.hasher.digest()
                st.hasher = None
        return self._state[model][name].digest


def _bytes(t: torch.Tensor | memoryview) -> memoryview:
    if isinstance(t, memoryview):  # bytes as read (merging/reading/batches.py)
        return t
    flat = t.contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def refuse_identical_agents(labels: list[str], agent_prints: list[dict]) -> None:
    """Two agents with byte-identical weights would double one agent's weight (and make every element
    it changed look shared): refused like the same folder given twice."""
    seen: dict[str, str] = {}
    for label, fp in zip(labels, agent_prints):
        other = seen.setdefault(fp["weights_xxh3_128"], label)
        if other != label:
            raise RamStudioError(f"agent {label} has the same weights as agent {other} (byte-identical tensors): "
                                 "giving one agent twice would double its weight.",
                                 "Remove the duplicate; every agent must be a different fine-tune.")

"""Lazy, read-only access to a safetensors checkpoint folder: headers up front, tensors row-chunk by row-chunk."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from .errors import RamStudioError
from .refs import ModelRef, parse_ref, resolve
from .safetensors_header import FileHeader, TensorEntry, read_header

INDEX_NAME = "model.safetensors.index.json"
PICKLE_PATTERNS = ("pytorch_model*.bin", "*.bin", "*.pt", "*.pth", "*.ckpt")
CONVERT_HINT = ("Pickle checkpoints are never loaded (unpickling can run code). Convert once in a trusted "
                "environment: AutoModelForCausalLM.from_pretrained(PATH).save_pretrained(OUT, "
                "safe_serialization=True), then use OUT.")


@dataclass
class Checkpoint:
    """One model: its reference, folder, config and tensor table; reads tensors lazily via safe_open."""

    ref: ModelRef
    folder: Path
    headers: list[FileHeader]
    tensors: dict[str, TensorEntry]
    config: dict | None
    _handles: dict[Path, object] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        return self.ref.label

    @property
    def num_params(self) -> int:
        return sum(e.numel for e in self.tensors.values())

    @property
    def bytes_on_disk(self) -> int:
        return sum(h.file_size for h in self.headers)

    def read(self, name: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        """Read tensor `name` (rows start:stop of dim 0 when given) in its stored dtype."""
        entry = self.tensors[name]
        handle = self._handles.get(entry.file)
        if handle is None:
            handle = safe_open(str(entry.file), framework="pt", device="cpu")
            self._handles[entry.file] = handle
        if start is None or len(entry.shape) == 0:
            return handle.get_tensor(name)
        return handle.get_slice(name)[start:stop]

    def release(self) -> None:
        """Close open files (unmapping them) so finished shards stop counting towards resident memory."""
        self._handles.clear()


    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def open_checkpoint(ref: ModelRef | str | Path, *, download: bool = True) -> Checkpoint:
    """Resolve a reference and read every shard header; no tensor data is touched."""
    ref = ref if isinstance(ref, ModelRef) else parse_ref(str(ref))
    folder = resolve(ref, download=download)
    return open_folder(folder, ref)


def open_folder(folder: Path, ref: ModelRef | None = None) -> Checkpoint:
    """Open a local folder holding model.safetensors or an indexed set of shards."""
    folder = Path(folder)
    ref = ref or ModelRef(str(folder), "local", path=folder)
    if not folder.exists():
        raise RamStudioError(f"model path {folder} does not exist.", "Check the path.")
    if not folder.is_dir():
        raise RamStudioError(f"{folder} is a file, not a model folder.",
                             "Point at the folder holding config.json and the .safetensors files.")
    files = _weight_files(folder)
    headers = [read_header(f) for f in files]
    tensors: dict[str, TensorEntry] = {}
    for h in headers:
        for name, entry in h.tensors.items():
            if name in tensors:
                raise RamStudioError(
                    f"tensor {name!r} is stored twice in {folder}: in {tensors[name].file.name} and {h.path.name}.",
                    "The shards are inconsistent; re-download or re-export the model.")
            tensors[name] = entry
    index = folder / INDEX_NAME
    if index.exists():
        _check_index_matches(folder, index, tensors)
    if not tensors:
        raise RamStudioError(f"{folder} holds safetensors files but no tensors.", "Re-export the model.")
    return Checkpoint(ref, folder, headers, tensors, _read_config(folder))


def _weight_files(folder: Path) -> list[Path]:
    """Which .safetensors files make up the model (the index decides when there is one)."""
    index = folder / INDEX_NAME
    if index.exists():
        weight_map = _load_index(index)
        files = []
        for shard in sorted(set(weight_map.values())):
            path = folder / shard
            if not path.is_file():
                raise RamStudioError(f"{index} points at shard {shard!r}, which is missing.",
                                     "Download the missing shard (or the whole model) again.")
            files.append(path)
        return files
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(folder.glob("model*.safetensors")) or sorted(folder.glob("*.safetensors"))
    if found:
        return found
    if any(any(folder.glob(p)) for p in PICKLE_PATTERNS):
        raise RamStudioError(f"{folder} holds only pickle weights (*.bin/*.pt).", CONVERT_HINT)
    raise RamStudioError(f"{folder} holds no model weights (no .safetensors files).",
                         "Point at a Hugging Face model folder with model.safetensors or sharded safetensors.")


def _load_index(index: Path) -> dict[str, str]:
    try:
        data = json.loads(index.read_text())
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RamStudioError(f"{index} is not a valid safetensors index ({exc}).",
                             "Re-download the index file.") from exc
    return weight_map


def _check_index_matches(folder: Path, index: Path, tensors: dict[str, TensorEntry]) -> None:
    """Every tensor named in the index must be in the shard the index names."""
    for name, shard in _load_index(index).items():
        entry = tensors.get(name)
        if entry is None:
            raise RamStudioError(f"{index} lists tensor {name!r} in {shard}, but no shard contains it.",
                                 "The index and shards disagree; re-download the model.")
        if entry.file.name != shard:
            raise RamStudioError(f"{index} puts {name!r} in {shard} but it is stored in {entry.file.name}.",
                                 "The index and shards disagree; re-download the model.")


def _read_config(folder: Path) -> dict | None:
    path = folder / "config.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RamStudioError(f"{path} is not valid JSON ({exc}).", "Fix or re-download config.json.") from exc

"""Lazy, read-only access to a safetensors checkpoint folder: headers up front, tensors row-chunk by row-chunk."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from merging.common.errors import RamStudioError, printable
from merging.reading.model_folder import is_plain_name, read_json_object, resolve_file
from merging.reading.refs import ModelRef, parse_ref, resolve
from merging.reading.safetensors_header import FileHeader, TensorEntry, read_header

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
        # A view (merging/reading/heads.py) may show a tensor under another name: read the stored one.
        if start is None or len(entry.shape) == 0:
            return handle.get_tensor(entry.name)
        return handle.get_slice(entry.name)[start:stop]

    def release(self) -> None:
        """Close open files (unmapping them) so finished shards stop counting towards resident memory."""
        self._handles.clear()


    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def unique_labels(labels: list[str]) -> list[str]:
    """Make agent labels distinct (two folders both named 'model' become model, model-2)."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label}-{seen[label]}")
    return out


def open_checkpoint(ref: ModelRef | str | Path, *, download: bool = True) -> Checkpoint:
    """Resolve a reference and read every shard header; no tensor data is touched."""
    ref = ref if isinstance(ref, ModelRef) else parse_ref(str(ref))
    folder = resolve(ref, download=download)
    return open_folder(folder, ref)


def open_folder(folder: Path, ref: ModelRef | None = None) -> Checkpoint:
    """Open a local folder holding model.safetensors or an indexed set of shards (read-only, headers only)."""
    folder = Path(folder)
    ref = ref or ModelRef(str(folder), "local", path=folder)
    if not folder.exists():
        raise RamStudioError(f"model path {folder} does not exist.", "Check the path.")
    if not folder.is_dir():
        raise RamStudioError(f"{folder} is a file, not a model folder.",
                             "Point at the folder holding config.json and the .safetensors files.")
    _refuse_adapter(folder)
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
        _check_index_matches(folder, tensors)
    if not tensors:
        raise RamStudioError(f"{folder} holds safetensors files but no tensors.", "Re-export the model.")
    return Checkpoint(ref, folder, headers, tensors, read_json_object(folder, "config.json", "config.json"))


def _refuse_adapter(folder: Path) -> None:
    """A PEFT/LoRA adapter is not a model: its weights are low-rank factors, not a task vector."""
    if (folder / "adapter_config.json").exists() or any(folder.glob("adapter_model*")):
        raise RamStudioError(f"{folder} is a LoRA/PEFT adapter, not a full model.",
                             "Merge it into full weights with peft first: PeftModel.from_pretrained(base, "
                             "ADAPTER).merge_and_unload().save_pretrained(OUT), then use OUT.")


def _weight_files(folder: Path) -> list[Path]:
    """Which .safetensors files make up the model (the index decides when there is one)."""
    index = folder / INDEX_NAME
    if index.exists() or index.is_symlink():
        files = []
        for shard in sorted(set(_load_index(folder).values())):
            try:
                files.append(resolve_file(folder, shard))
            except FileNotFoundError:
                raise RamStudioError(f"{index} points at shard {printable(shard, 80)!r}, which is missing.",
                                     "Download the missing shard (or the whole model) again.") from None
        return files
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".safetensors"))
    single = [n for n in names if n == "model.safetensors"]
    chosen = single or [n for n in names if n.startswith("model")] or names
    if chosen:
        return [resolve_file(folder, n) for n in chosen]
    if any(any(folder.glob(p)) for p in PICKLE_PATTERNS):
        raise RamStudioError(f"{folder} holds only pickle weights (*.bin/*.pt).", CONVERT_HINT)
    raise RamStudioError(f"{folder} holds no model weights (no .safetensors files).",
                         "Point at a Hugging Face model folder with model.safetensors or sharded safetensors.")


def _load_index(folder: Path) -> dict[str, str]:
    """The index's weight_map: tensor name → shard, where every shard is a plain .safetensors file name."""
    data = read_json_object(folder, INDEX_NAME, "safetensors index")
    weight_map = (data or {}).get("weight_map")
    index = folder / INDEX_NAME
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in weight_map.items()):
        raise RamStudioError(f"{index} is not a valid safetensors index (no weight_map of strings).",
                             "Re-download the index file.")
    for shard in set(weight_map.values()):
        if not (is_plain_name(shard) and shard.endswith(".safetensors")):
            raise RamStudioError(f"{index} names a shard {printable(shard, 80)!r} that is not a plain "
                                 ".safetensors file name inside the folder.",
                                 "Only files inside a model folder are read; re-download the index file.")
    return weight_map


def _check_index_matches(folder: Path, tensors: dict[str, TensorEntry]) -> None:
    """Every tensor named in the index must be in the shard the index names."""
    index = folder / INDEX_NAME
    for name, shard in _load_index(folder).items():
        entry = tensors.get(name)
        if entry is None:
            raise RamStudioError(f"{index} lists tensor {name!r} in {shard}, but no shard contains it.",
                                 "The index and shards disagree; re-download the model.")
        if entry.file.name != shard:
            raise RamStudioError(f"{index} puts {name!r} in {shard} but it is stored in {entry.file.name}.",
                                 "The index and shards disagree; re-download the model.")


def tensor_order(base: Checkpoint) -> list[str]:
    """Base tensors in on-disk order (file, offset): sequential reads, and a stable output order."""
    return sorted(base.tensors, key=lambda n: (base.tensors[n].file.name, base.tensors[n].begin))

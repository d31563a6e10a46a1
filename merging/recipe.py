"""The merge recipe: everything needed to reproduce a merge, as JSON (inputs, method, parameters, versions)."""
from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import RamStudioError

RECIPE_NAME = "ram_recipe.json"
RECIPE_FORMAT = 1


@dataclass
class MergeSpec:
    """What to merge and how; the CLI, the app and `run RECIPE` all build one of these."""

    base: str
    agents: list[str]
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    out: str = ""
    out_dtype: str | None = None  # safetensors code, None = the base's dtype
    shard_size: str = "5GB"
    device: str = "auto"
    chunk_elems: int = 1 << 23
    on_mismatch: str = "error"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MergeSpec":
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise RamStudioError(f"recipe has unknown fields {sorted(unknown)}.", "Was it written by a newer version?")
        try:
            return cls(**data)
        except TypeError as exc:
            raise RamStudioError(f"recipe is incomplete ({exc}).", "Recreate it with a merge.") from None


def versions() -> dict[str, str]:
    """Versions of what computed the merge, recorded for reproducibility."""
    import safetensors
    import torch

    from . import __version__

    return {"ram_studio": __version__, "torch": torch.__version__, "safetensors": safetensors.__version__,
            "python": platform.python_version()}


def write_recipe(folder: Path, spec: MergeSpec, inputs: list[dict[str, Any]], extra: dict[str, Any]) -> Path:
    """Write ram_recipe.json: the spec, input fingerprints (files, sizes, header hashes) and versions."""
    doc = {"format": RECIPE_FORMAT, "spec": spec.to_json(), "inputs": inputs, "versions": versions(), **extra}
    path = folder / RECIPE_NAME
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    return path


def read_recipe(path: Path) -> tuple[MergeSpec, dict[str, Any]]:
    """Load a recipe file (or a merged folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / RECIPE_NAME
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise RamStudioError(f"recipe {path} does not exist.", "Give a ram_recipe.json file.") from None
    except (OSError, ValueError) as exc:
        raise RamStudioError(f"recipe {path} is not valid JSON ({exc}).", "Give a ram_recipe.json file.") from None
    if not isinstance(doc, dict) or doc.get("format") != RECIPE_FORMAT or "spec" not in doc:
        raise RamStudioError(f"{path} is not a RAM Studio recipe (format {RECIPE_FORMAT}).",
                             "Give the ram_recipe.json written next to a merged model.")
    return MergeSpec.from_json(doc["spec"]), doc

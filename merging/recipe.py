"""The merge recipe: everything needed to reproduce a merge, as JSON (inputs, method, parameters, versions).

A recipe is read back by `run RECIPE`, so it is validated field by field like any other untrusted input:
every malformed recipe is a one-line error, never a traceback or a wrong model.
"""
from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from merging.common.errors import RamStudioError, printable
from merging.common.units import parse_size
from merging.common.untrusted import TooComplex, loads_json
from merging.reading.fingerprint import refuse_identical_agents

if TYPE_CHECKING:
    from merging.reading.checkpoint import Checkpoint

RECIPE_NAME = "ram_recipe.json"
RECIPE_FORMAT = 2
OUT_DTYPES = ("F32", "F16", "BF16", "F64")  # a merge writes floats; integer or 8-bit float outputs are refused
MAX_RECIPE_BYTES = 16 << 20
MAX_CHUNK_ELEMS = 1 << 31
# The most agents one merge takes: far more than any real merge (the paper merges 3), few enough that every
# per-agent structure stays small; checked first, in constant time, wherever a list of agents comes in.
MAX_AGENTS = 64
MAX_FILES_PER_INPUT = 100_000  # shards a recorded input may list (real models: 1–200)
DEVICE_NAMES = ("auto", "cpu", "cuda")
POLICY_NAMES = ("error", "base")
VOCAB_NAMES = ("base", "union")


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
    vocab: str = "base"  # "union": keep the tokens agents add (merging/reading/vocab.py)
    untie: bool = False  # write an untied head for a tied base (merging/reading/heads.py)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "recipe") -> "MergeSpec":
        """A validated spec from stored JSON: every field of the right type and in range."""
        if not isinstance(data, dict):
            raise RamStudioError(f"{where}: 'spec' is not an object.", "Recreate the recipe with a merge.")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise RamStudioError(f"{where} has unknown fields {printable(unknown, 80)}.",
                                 "Was it written by a newer version?")
        missing = [k for k in ("base", "agents", "method") if k not in data]
        if missing:
            raise RamStudioError(f"{where} lacks {', '.join(missing)}.", "Recreate the recipe with a merge.")

        def bad(name: str, what: str) -> RamStudioError:
            return RamStudioError(f"{where}: {name} {what}.", "Fix the field or recreate the recipe with a merge.")

        if not _text(data["base"]):
            raise bad("base", "must be a non-empty string")
        agents = data["agents"]
        if not isinstance(agents, list):
            raise bad("agents", "must be a list of non-empty strings")
        check_agent_count(len(agents), where)
        if not all(_text(a) for a in agents):
            raise bad("agents", "must be a list of non-empty strings")
        if not isinstance(data["method"], str):
            raise bad("method", "must be a string")
        from merging.methods import get_method  # the registry imports every method module

        method = get_method(data["method"])
        params = data.get("params", {})
        if not isinstance(params, dict):
            raise bad("params", "must be an object")
        params = method.resolve_params(params, strict=True)
        out = data.get("out", "")
        if not isinstance(out, str):
            raise bad("out", "must be a string")

        out_dtype = data.get("out_dtype")
        if out_dtype is not None and out_dtype not in OUT_DTYPES:
            raise bad("out_dtype", f"must be null or one of {', '.join(OUT_DTYPES)}")
        shard = data.get("shard_size", "5GB")
        if isinstance(shard, bool) or not isinstance(shard, (str, int)):
            raise bad("shard_size", "must be a size like 5GB")
        parse_size(shard)
        device = data.get("device", "auto")
        if not isinstance(device, str) or not (device in DEVICE_NAMES or _cuda_index(device)):
            raise bad("device", "must be auto, cpu, cuda or cuda:N")
        chunk = data.get("chunk_elems", 1 << 23)
        if type(chunk) is not int or not 0 < chunk <= MAX_CHUNK_ELEMS:
            raise bad("chunk_elems", f"must be an integer in [1, {MAX_CHUNK_ELEMS}]")
        policy = data.get("on_mismatch", "error")
        if policy not in POLICY_NAMES:
            raise bad("on_mismatch", f"must be one of {', '.join(POLICY_NAMES)}")
        vocab = data.get("vocab", "base")
        if vocab not in VOCAB_NAMES:
            raise bad("vocab", f"must be one of {', '.join(VOCAB_NAMES)}")
        untie = data.get("untie", False)
        if not isinstance(untie, bool):
            raise bad("untie", "must be true or false")
        return cls(data["base"], list(agents), data["method"], params, out, out_dtype, shard, device, chunk, policy,
                   vocab, untie)


def check_agent_count(n: int, where: str = "") -> None:
    """Refuse more agents than a merge takes (MAX_AGENTS) before anything is done per agent."""
    if n > MAX_AGENTS:
        raise RamStudioError(f"{where + ': ' if where else ''}{n:,} agents given; a merge takes at most {MAX_AGENTS}.",
                             "Merge fewer agents at once.")


def is_output_name(name: str) -> bool:
    """A recipe's recorded output folder: one plain name (never a path, '..', or absolute)."""
    from merging.reading.model_folder import is_plain_name

    return is_plain_name(name)


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip()) and len(v) < 4096


def _cuda_index(device: str) -> bool:
    return device.startswith("cuda:") and device[5:].isdigit()


def versions() -> dict[str, str]:
    """Versions of what computed the merge, recorded for reproducibility."""
    import safetensors
    import torch

    from merging.common.versions import ram_studio_version

    return {"ram_studio": ram_studio_version(), "torch": torch.__version__, "safetensors": safetensors.__version__,
            "python": platform.python_version()}


def recipe_document(spec: MergeSpec, inputs: list[dict[str, Any]], extra: dict[str, Any]) -> dict[str, Any]:
    """The recipe: the spec, each input's identity (files, sizes, content fingerprints, Hub commit), versions."""
    return {"format": RECIPE_FORMAT, "spec": spec.to_json(), "inputs": inputs, "versions": versions(), **extra}


def write_recipe(folder: Path, doc: dict[str, Any]) -> Path:
    path = folder / RECIPE_NAME
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    return path


def read_recipe(path: Path) -> tuple[MergeSpec, dict[str, Any]]:
    """Load and validate a recipe file (or a merged folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / RECIPE_NAME
    try:
        if path.stat().st_size > MAX_RECIPE_BYTES:
            raise RamStudioError(f"recipe {path} is larger than {MAX_RECIPE_BYTES >> 20} MB.",
                                 "Give a ram_recipe.json file.")
        with open(path, "rb") as f:
            doc = loads_json(f.read(MAX_RECIPE_BYTES + 1).decode("utf-8"))
    except FileNotFoundError:
        raise RamStudioError(f"recipe {path} does not exist.", "Give a ram_recipe.json file.") from None
    except TooComplex as exc:
        raise RamStudioError(f"recipe {path} {exc.reason}.", "Give the ram_recipe.json written next to a merged "
                                                            "model.") from None
    except (OSError, ValueError):
        raise RamStudioError(f"recipe {path} is not valid UTF-8 JSON.", "Give a ram_recipe.json file.") from None
    if not isinstance(doc, dict) or doc.get("format") not in (1, RECIPE_FORMAT) or "spec" not in doc:
        raise RamStudioError(f"{path} is not a RAM Studio recipe (format {RECIPE_FORMAT}).",
                             "Give the ram_recipe.json written next to a merged model.")
    spec = MergeSpec.from_json(doc["spec"], f"recipe {path}")
    inputs = doc.get("inputs", [])
    if not isinstance(inputs, list) or len(inputs) > MAX_AGENTS + 1 or not all(
            isinstance(i, dict) and isinstance(i.get("files", []), list)
            and len(i.get("files", [])) <= MAX_FILES_PER_INPUT for i in inputs):
        raise RamStudioError(f"recipe {path}: inputs must be a list of at most {MAX_AGENTS + 1} objects, each with "
                             f"at most {MAX_FILES_PER_INPUT:,} files.", "Recreate the recipe with a merge.")
    return spec, doc


def fingerprint_mismatches(recorded: list[dict[str, Any]], current: list[dict[str, Any]],
                           content: bool = True) -> list[str]:
    """What differs between the inputs a recipe recorded and the inputs found now: file names, sizes and
    header hashes, and (with `content`) the content fingerprints the streaming read computed."""
    problems = []
    for i, (old, new) in enumerate(zip(recorded, current)):
        label = printable(new.get("label") or old.get("label") or f"input {i}", 80)
        old_files = {f["name"]: f for f in old.get("files", [])
                     if isinstance(f, dict) and isinstance(f.get("name"), str)}
        new_files = {f["name"]: f for f in new["files"]}
        if set(old_files) != set(new_files):
            problems.append(f"{label}: the files differ ({len(old_files)} recorded, {len(new_files)} now)")
            continue
        for name, f in new_files.items():
            o = old_files[name]
            if o.get("size") != f["size"] or o.get("header_sha256") != f["header_sha256"]:
                problems.append(f"{label}: {printable(name, 80)} has changed since the recipe was written")
            elif not content:
                continue
            elif "xxh3_128" not in o:
                problems.append(f"{label}: the recipe has no content fingerprint for {printable(name, 80)}")
            elif o.get("xxh3_128") != f["xxh3_128"]:
                problems.append(f"{label}: {printable(name, 80)} has changed since the recipe was written")
    if len(recorded) != len(current):
        problems.append(f"the recipe records {len(recorded)} inputs, the spec has {len(current)}")
    return problems


def check_local_inputs(spec: MergeSpec, doc: dict[str, Any]) -> None:
    """Inputs the recipe recorded as local folders must be local folders now: one that is missing here (a
    relative path run from another folder) is an error, never taken for a Hub id and fetched."""
    from merging.reading.refs import demo_prefix

    recorded = [i for i in doc.get("inputs", []) if isinstance(i, dict)]
    for ref, rec in zip([spec.base, *spec.agents], recorded):
        kind = rec.get("kind")
        if kind is None:  # recipes written before the kind was recorded: a Hub input has its commit
            kind = "hub" if rec.get("commit") else ("demo" if demo_prefix(ref) else "local")
        if kind == "local" and not Path(ref).expanduser().exists():
            raise RamStudioError(
                f"the recipe's input {printable(ref, 200)!r} was a local folder when the merge ran, and it does not "
                f"exist from here ({Path.cwd()}).",
                "Run from the folder the merge ran in (relative paths are relative to it), or give the recipe "
                "the folders' paths as they are on this machine. It is never looked up on the Hub.")


def input_identities(models: list[Checkpoint], prints: list[dict[str, Any]], labels: list[str],
                expected: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Each input's identity for the recipe; refuses byte-identical agents and (with `expected`) inputs
    whose content differs from what a recipe recorded."""
    refuse_identical_agents(labels, prints[1:])
    out = []
    for c, label, fp in zip(models, ["base", *labels], prints):
        # A Hub snapshot folder is named by its commit hash: record it, so a recipe pins what was merged.
        out.append({"ref": c.ref.raw, "kind": c.ref.kind, "label": label, "revision": c.ref.revision,
                    "commit": c.folder.name if c.ref.kind == "hub" else None,
                    "weights_xxh3_128": fp["weights_xxh3_128"], **file_identity(c, fp)})
    if expected is not None:
        refuse_changed(expected, out, content=True)
    return out


def file_identity(c: Checkpoint, fp: dict[str, Any] | None) -> dict[str, Any]:
    """Each weight file's name, size, header hash and (once read) content fingerprint."""
    return {"label": c.label, "files": [{"name": h.path.name, "size": h.file_size, "header_sha256": h.header_sha256,
                                         **({"xxh3_128": fp["files"][h.path.name]} if fp else {})}
                                        for h in c.headers]}


def refuse_changed(expected: list[dict[str, Any]], found: list[dict[str, Any]], content: bool) -> None:
    problems = fingerprint_mismatches(expected, found, content)
    if problems:
        raise RamStudioError(f"the inputs differ from those the recipe recorded: {'; '.join(problems[:3])}"
                             + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "") + ".",
                             "Point the recipe at the original models, or pass --allow-changed-inputs to "
                             "merge the models as they are now.")

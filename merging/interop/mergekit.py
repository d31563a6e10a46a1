"""mergekit YAML configs: run theirs, write ours as theirs.

`read_mergekit_yaml` maps a mergekit 0.1.5 config for a method both tools have onto a `MergeSpec`,
field by field, and refuses — with one line naming the field — anything RAM Studio would not reproduce
faithfully (unequal per-model weights, layer slices, tokenizer merges, gradient or conditional parameter
values, unknown methods or fields). Nothing in a config is executed: it is read with the safe loader, after
a bounded first look (`merging.common.untrusted.loads_yaml`: no aliases, limited depth, size and node count).
Numbers are read the way mergekit reads them: PyYAML's YAML 1.1 resolver takes `1e-5` (no dot) for a string,
and mergekit's pydantic models then convert such a string to a float; so do we (`_number`).
`to_mergekit_yaml` writes a spec as the mergekit config that computes the same merge, or says why there is
none (global ρ has no mergekit equivalent) and what the nearest config is.

What each mergekit method computes, and how it maps onto ours, is declared in the method's own file
(`MergeMethod.mergekit`, see `merging.methods.mergekit_map`); this module reads those declarations from
the registry and owns only the YAML, the top-level fields, the model references and the dtypes.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from merging.common.dtypes import CODE_TO_NAME
from merging.common.errors import RamStudioError, printable
from merging.common.untrusted import TooComplex, loads_yaml
from merging.methods import METHODS
from merging.methods.mergekit_map import MergekitInput, MergekitRead, refuse
from merging.recipe import MAX_AGENTS, MergeSpec

MAX_CONFIG_BYTES = 1 << 20
# What pydantic (mergekit's config models) accepts when it converts a string to a float: ASCII decimal
# digits with optional underscores between them, a point, an exponent, surrounding whitespace; or inf/nan.
_FLOAT_TEXT = re.compile(r"\s*[+-]?(?:\d(?:_?\d)*(?:\.(?:\d(?:_?\d)*)?)?|\.\d(?:_?\d)*)(?:[eE][+-]?\d(?:_?\d)*)?\s*",
                         re.ASCII)
_NONFINITE_TEXT = re.compile(r"\s*[+-]?(?:inf|infinity|nan)\s*", re.ASCII | re.IGNORECASE)
TOP_LEVEL = {"merge_method", "base_model", "models", "parameters", "dtype", "out_dtype", "tokenizer_source",
             "tokenizer", "chat_template", "slices", "modules"}
_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}


@dataclass
class MergekitConfig:
    """A mergekit config read as a RAM Studio merge, and what to tell the user about the translation."""

    spec: MergeSpec
    notes: list[str] = field(default_factory=list)


def _readers() -> dict[str, tuple[str, MergekitRead]]:
    """mergekit method name → (our method, how to read it), from the methods' declared mappings."""
    return {r.name: (m.name, r) for m in METHODS.values() if m.mergekit for r in m.mergekit.reads}


def _number(value: Any) -> Any:
    """A string that mergekit's pydantic models would read as a float (e.g. `1e-5`, which YAML 1.1 leaves a
    string) as that float; anything else unchanged."""
    if (isinstance(value, str) and len(value) <= 64
            and (_FLOAT_TEXT.fullmatch(value) or _NONFINITE_TEXT.fullmatch(value))):
        return float(value.strip().replace("_", ""))
    return value


def _scalar(value: Any, where: str) -> Any:
    """A parameter value must be one number or boolean: gradients (lists) and filters are refused."""
    value = _number(value)
    if isinstance(value, bool) or (isinstance(value, (int, float)) and math.isfinite(value)):
        return value
    if isinstance(value, (list, dict)):
        raise refuse(f"{where} is a gradient or conditional (list-valued) parameter",
                     "RAM Studio applies one value to every tensor; give a single number.")
    if isinstance(value, float):
        raise refuse(f"{where} must be a finite number, got {value}")
    raise refuse(f"{where} must be a number, got {_shown(value)}")


def _shown(value: Any) -> str:
    """A short, escaped rendering of a value from the config (never the whole of a large structure)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return repr(printable(value, 40)) if isinstance(value, str) else printable(value, 40)
    return f"a {type(value).__name__}"


def _model_ref(value: Any, where: str) -> str:
    if isinstance(value, dict):
        raise refuse(f"{where} is a structured model reference",
                     "Give the model as a path or an org/name[@revision] id.")
    if not isinstance(value, str) or not value.strip():
        raise refuse(f"{where} must be a model path or Hub id")
    if "+" in value:
        raise refuse(f"{where} ({printable(value, 80)}) applies a LoRA adapter (model+lora)",
                     "Merge the adapter into full weights with peft first, then use that folder.")
    return value.strip()


def _load(text: str) -> dict[str, Any]:
    """The document as a mapping, read with the bounded safe loader; unreadable text is refused."""
    import yaml

    if len(text.encode("utf-8", "replace")) > MAX_CONFIG_BYTES:
        raise refuse("the file is larger than 1 MB")
    try:
        doc = loads_yaml(text)
    except TooComplex as exc:
        raise refuse(f"the document {exc.reason}", "Write the config out plainly (no anchors or aliases).") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise refuse(f"not valid YAML{where}", "Check the file.") from None
    except ValueError:  # a scalar the loader cannot convert (e.g. an integer with thousands of digits)
        raise refuse("a value could not be read", "Check the numbers in the file.") from None
    if not isinstance(doc, dict):
        raise refuse("the document is not a mapping of fields")
    return doc


def _check_top_level(doc: dict[str, Any]) -> None:
    """Refuse unknown fields and the mergekit features RAM Studio does not reproduce."""
    unknown = sorted(str(k) for k in doc if k not in TOP_LEVEL)
    if unknown:
        raise refuse(f"unknown field {printable(', '.join(unknown), 80)}")
    for key, why in (("slices", "layer slices"), ("modules", "per-module merges")):
        if doc.get(key):
            raise refuse(f"'{key}' ({why}) is not supported",
                         "RAM Studio merges whole models: list them under 'models'.")
    if doc.get("tokenizer") is not None:
        raise refuse("'tokenizer' (tokenizer merging) is not supported", "RAM Studio copies the base's tokenizer.")
    if doc.get("chat_template") is not None:
        raise refuse("'chat_template' is not supported", "RAM Studio copies the base's chat template.")
    if doc.get("tokenizer_source") not in (None, "base"):
        raise refuse(f"tokenizer_source {printable(doc.get('tokenizer_source'), 40)!r} is not supported",
                     "Only 'base' (the base's tokenizer, which RAM Studio copies) can be reproduced.")


def _global_params(doc: dict[str, Any], read: MergekitRead) -> dict[str, Any]:
    """The config's global parameters, mergekit's defaults filled in; ones the method does not take are refused."""
    g = doc.get("parameters") or {}
    if not isinstance(g, dict):
        raise refuse("'parameters' must be a mapping")
    allowed = set(read.defaults) | read.per_model
    for k in g:
        if k not in allowed:
            raise refuse(f"parameter {printable(k, 40)!r} is not one {read.name} takes",
                         f"{read.name} takes: {', '.join(sorted(allowed)) or 'none'}.")
    return {k: _scalar(g.get(k, d), f"parameters.{k}") for k, d in read.defaults.items()}


def _models(doc: dict[str, Any], read: MergekitRead) -> list[tuple[str, dict[str, Any]]]:
    """Each listed model's reference and per-model parameters (a global value where the model gives none)."""
    g, models = doc.get("parameters") or {}, doc.get("models")
    if not isinstance(models, list) or not models:
        raise refuse("'models' must be a non-empty list")
    if len(models) > MAX_AGENTS + 1:
        raise refuse(f"'models' lists {len(models):,} models; a merge takes at most {MAX_AGENTS} agents")
    listed = []
    for i, m in enumerate(models):
        if not isinstance(m, dict) or "model" not in m or set(m) - {"model", "parameters"}:
            raise refuse(f"models[{i}] must be a mapping with 'model' and optional 'parameters'")
        ref = _model_ref(m["model"], f"models[{i}].model")
        p = m.get("parameters") or {}
        if not isinstance(p, dict):
            raise refuse(f"models[{i}].parameters must be a mapping")
        for k in p:
            if k not in read.per_model:
                raise refuse(f"models[{i}].parameters.{printable(k, 40)} is not a per-model parameter of {read.name}",
                             f"Per-model parameters of {read.name}: {', '.join(sorted(read.per_model)) or 'none'}.")
        listed.append((ref, {k: _scalar(p.get(k, g.get(k)), f"models[{i}].parameters.{k}") for k in read.per_model
                             if p.get(k, g.get(k)) is not None}))
    return listed


def _dtypes(doc: dict[str, Any], spec: MergeSpec, params: dict[str, Any], notes: list[str]) -> None:
    """The output dtype (`out_dtype`, else `dtype`) and the notes on what mergekit would compute differently."""
    out_name = doc.get("out_dtype") or doc.get("dtype")
    for key in ("dtype", "out_dtype"):
        if doc.get(key) is not None and (not isinstance(doc[key], str) or doc[key] not in _DTYPES):
            raise refuse(f"{key} {printable(doc[key], 40)!r} is not one of {', '.join(_DTYPES)}")
    spec.out_dtype = _DTYPES[out_name] if out_name else None
    if doc.get("dtype") not in (None, "float32"):
        notes.append(f"dtype {doc['dtype']}: mergekit would compute in {doc['dtype']}; RAM Studio computes task "
                     "vectors and merges in float32 from the stored values (a more precise result, not bit-identical)")
    if params.get("int8_mask"):
        notes.append("int8_mask only sets mergekit's mask dtype; it has no effect on the result")


def read_mergekit_yaml(text: str) -> MergekitConfig:
    """Translate a mergekit YAML config into a MergeSpec (output folder left empty)."""
    doc = _load(text)
    _check_top_level(doc)
    method, readers = doc.get("merge_method"), _readers()
    if not isinstance(method, str) or method not in readers:
        raise refuse(f"merge_method {printable(method, 40)!r} is not one RAM Studio reproduces",
                     f"Supported: {', '.join(readers)}.")
    ours, read = readers[method]
    if doc.get("base_model") is None:
        raise refuse("base_model is required", "RAM Studio merges task vectors relative to a base model.")
    base = _model_ref(doc["base_model"], "base_model")
    params = _global_params(doc, read)
    listed = _models(doc, read)
    agents = [(ref, p) for ref, p in listed if ref != base]
    if len(agents) < 2:
        raise refuse(f"{len(agents)} model(s) besides base_model", "A merge needs at least two agents.")
    given = MergekitInput(method, agents, params, base_listed=len(agents) < len(listed))
    spec = MergeSpec(base, [ref for ref, _ in agents], ours, read.translate(given))
    _dtypes(doc, spec, params, given.notes)
    return MergekitConfig(spec, given.notes)


def parse_mergekit_yaml(text: str) -> MergeSpec:
    """The MergeSpec a mergekit YAML config describes (see read_mergekit_yaml for the notes)."""
    return read_mergekit_yaml(text).spec


# ---------------------------------------------------------------- ours → theirs

def to_mergekit_yaml(spec: MergeSpec, model_paths: dict[str, str] | None = None,
                     out_dtype: str | None = None) -> tuple[str | None, str]:
    """The mergekit config computing the same merge as `spec`, or (None, why not + the nearest config).

    `model_paths` maps references mergekit cannot read (demo:NAME, demo-shared:NAME) to their folders; `out_dtype` is
    the dtype the merge writes (the spec's, else the base's): the config states it, because its `dtype: float32`
    (compute like RAM Studio) would otherwise also be mergekit's output dtype. The method's own declared mapping
    (`MergeMethod.mergekit`) says which mergekit method and parameters."""
    import yaml

    from merging.reading.refs import demo_folder

    paths = model_paths or {}
    out_dtype = out_dtype or (None if spec.out_dtype else _stored_dtype(spec.base))
    written = spec.out_dtype or out_dtype
    if written and written not in CODE_TO_NAME:  # e.g. an F8_E4M3 base merged in its own dtype
        return None, (f"mergekit cannot write {written} weights (its out_dtype takes "
                      f"{', '.join(CODE_TO_NAME.values())}),"
                      " so it has no config for this merge.")
    method = METHODS.get(spec.method)
    if method is None or method.mergekit is None:
        return None, f"mergekit has no equivalent of {spec.method}."
    eq = method.mergekit.write(spec.params, len(spec.agents))

    def ref(r: str) -> str:
        return paths.get(r) or demo_folder(r)

    doc: dict[str, Any] = {"merge_method": eq.method, "base_model": ref(spec.base)}
    doc["models"] = [{"model": ref(a), **({"parameters": dict(eq.model_parameters)} if eq.model_parameters else {})}
                     for a in spec.agents]
    if eq.parameters:
        doc["parameters"] = eq.parameters
    doc["dtype"] = "float32"  # RAM Studio computes in float32: ask mergekit to do the same
    if written:
        doc["out_dtype"] = CODE_TO_NAME[written]
    unlike = (["RAM Studio's union vocabulary takes each added token's row from the agents that added it, while "
               "mergekit's tokenizer_source: union computes the added rows its own way"] if spec.vocab == "union"
              else []) + (["mergekit does not write an untied head for a tied base"] if spec.untie else [])
    if spec.vocab == "union":
        doc["tokenizer_source"] = "union"
    text = yaml.safe_dump(doc, sort_keys=False)
    if unlike:
        return None, f"{'; '.join(unlike)}, so no mergekit config computes exactly this merge.\n{text}"
    return (text, eq.note) if eq.exact else (None, f"{eq.note}\n{text}")


def _stored_dtype(ref: str) -> str | None:
    """The base's float dtype from its headers when it is on disk (no download), else None."""
    from merging.reading.checkpoint import open_checkpoint
    from merging.writing.side_files import base_float_dtype

    try:
        with open_checkpoint(ref, download=False) as ckpt:
            return base_float_dtype(ckpt)
    except (RamStudioError, OSError):
        return None

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

Semantics read from mergekit 0.1.5 (merge_methods/generalized_task_arithmetic.py, linear.py, ram.py):
- task_arithmetic: θ0 + λ·Σ w_t τ_t, divided by Σ w_t when `normalize` (default false).
- ties: top-k trim per tensor (k from `density`), sign election on Σ w_t τ_t, then Σ of the agreeing
  w_t τ_t divided by the agreeing Σ w_t when `normalize` (default true) — with equal weights, the
  disjoint mean — then × λ.
- dare_linear / dare_ties: random drop keeping a `density` share, `rescale` (default true) to keep the
  L1 norm, then as task_arithmetic / ties (`normalize` default false for both).
- linear: Σ w_t θ_t / Σ w_t (normalize default true) over the listed models, the base only if listed.
- ram: mean of active τ where ≥ 2 agents changed an element, τ_t where one did (`epsilon`, per tensor).
- ramplus_tl: ram with unique updates × 1 + r·clip(ρ_t, 0, α), ρ_t per tensor (`r` 0.1, `alpha` 0.2).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from merging.common.dtypes import CODE_TO_NAME
from merging.common.errors import RamStudioError, printable
from merging.recipe import MAX_AGENTS, MergeSpec
from merging.common.untrusted import TooComplex, loads_yaml

MAX_CONFIG_BYTES = 1 << 20
# What pydantic (mergekit's config models) accepts when it converts a string to a float: ASCII decimal
# digits with optional underscores between them, a point, an exponent, surrounding whitespace; or inf/nan.
_FLOAT_TEXT = re.compile(r"\s*[+-]?(?:\d(?:_?\d)*(?:\.(?:\d(?:_?\d)*)?)?|\.\d(?:_?\d)*)(?:[eE][+-]?\d(?:_?\d)*)?\s*",
                         re.ASCII)
_NONFINITE_TEXT = re.compile(r"\s*[+-]?(?:inf|infinity|nan)\s*", re.ASCII | re.IGNORECASE)
TOP_LEVEL = {"merge_method", "base_model", "models", "parameters", "dtype", "out_dtype", "tokenizer_source",
             "tokenizer", "chat_template", "slices", "modules"}
# Per method: our method, the global parameters it takes, the per-model ones, mergekit's defaults.
MERGEKIT_METHODS: dict[str, dict[str, Any]] = {
    "task_arithmetic": {"global": {"lambda": 1.0, "normalize": False, "int8_mask": False, "rescale": False},
                        "per_model": {"weight"}},
    "linear": {"global": {"normalize": True}, "per_model": {"weight"}},
    "ties": {"global": {"lambda": 1.0, "normalize": True, "int8_mask": False, "rescale": False},
             "per_model": {"weight", "density"}},
    "dare_linear": {"global": {"lambda": 1.0, "normalize": False, "int8_mask": False, "rescale": True},
                    "per_model": {"weight", "density"}},
    "dare_ties": {"global": {"lambda": 1.0, "normalize": False, "int8_mask": False, "rescale": True},
                  "per_model": {"weight", "density"}},
    "ram": {"global": {"epsilon": 1e-5}, "per_model": set()},
    "ramplus_tl": {"global": {"epsilon": 1e-5, "r": 0.1, "alpha": 0.2}, "per_model": set()},
}
_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}


@dataclass
class MergekitConfig:
    """A mergekit config read as a RAM Studio merge, and what to tell the user about the translation."""

    spec: MergeSpec
    notes: list[str] = field(default_factory=list)


def _refuse(what: str, hint: str = "") -> RamStudioError:
    return RamStudioError(f"mergekit config: {what}.",
                          hint or "RAM Studio runs only what it reproduces faithfully; change or remove that field.")


def _number(value: Any) -> Any:
    """A string that mergekit's pydantic models would read as a float (e.g. `1e-5`, which YAML 1.1 leaves a
    string) as that float; anything else unchanged."""
    if isinstance(value, str) and len(value) <= 64 and (_FLOAT_TEXT.fullmatch(value) or _NONFINITE_TEXT.fullmatch(value)):
        return float(value.strip().replace("_", ""))
    return value


def _scalar(value: Any, where: str) -> Any:
    """A parameter value must be one number or boolean: gradients (lists) and filters are refused."""
    value = _number(value)
    if isinstance(value, bool) or (isinstance(value, (int, float)) and math.isfinite(value)):
        return value
    if isinstance(value, (list, dict)):
        raise _refuse(f"{where} is a gradient or conditional (list-valued) parameter",
                      "RAM Studio applies one value to every tensor; give a single number.")
    if isinstance(value, float):
        raise _refuse(f"{where} must be a finite number, got {value}")
    raise _refuse(f"{where} must be a number, got {_shown(value)}")


def _shown(value: Any) -> str:
    """A short, escaped rendering of a value from the config (never the whole of a large structure)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return repr(printable(value, 40)) if isinstance(value, str) else printable(value, 40)
    return f"a {type(value).__name__}"


def _model_ref(value: Any, where: str) -> str:
    if isinstance(value, dict):
        raise _refuse(f"{where} is a structured model reference", "Give the model as a path or an org/name[@revision] id.")
    if not isinstance(value, str) or not value.strip():
        raise _refuse(f"{where} must be a model path or Hub id")
    if "+" in value:
        raise _refuse(f"{where} ({printable(value, 80)}) applies a LoRA adapter (model+lora)",
                      "Merge the adapter into full weights with peft first, then use that folder.")
    return value.strip()


def read_mergekit_yaml(text: str) -> MergekitConfig:
    """Translate a mergekit YAML config into a MergeSpec (output folder left empty)."""
    import yaml

    if len(text.encode("utf-8", "replace")) > MAX_CONFIG_BYTES:
        raise _refuse("the file is larger than 1 MB")
    try:
        doc = loads_yaml(text)
    except TooComplex as exc:
        raise _refuse(f"the document {exc.reason}", "Write the config out plainly (no anchors or aliases).") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise _refuse(f"not valid YAML{where}", "Check the file.") from None
    except ValueError:  # a scalar the loader cannot convert (e.g. an integer with thousands of digits)
        raise _refuse("a value could not be read", "Check the numbers in the file.") from None
    if not isinstance(doc, dict):
        raise _refuse("the document is not a mapping of fields")
    unknown = sorted(str(k) for k in doc if k not in TOP_LEVEL)
    if unknown:
        raise _refuse(f"unknown field {printable(', '.join(unknown), 80)}")
    for key, why in (("slices", "layer slices"), ("modules", "per-module merges")):
        if doc.get(key):
            raise _refuse(f"'{key}' ({why}) is not supported", "RAM Studio merges whole models: list them under 'models'.")
    if doc.get("tokenizer") is not None:
        raise _refuse("'tokenizer' (tokenizer merging) is not supported", "RAM Studio copies the base's tokenizer.")
    if doc.get("chat_template") is not None:
        raise _refuse("'chat_template' is not supported", "RAM Studio copies the base's chat template.")
    if doc.get("tokenizer_source") not in (None, "base"):
        raise _refuse(f"tokenizer_source {printable(doc.get('tokenizer_source'), 40)!r} is not supported",
                      "Only 'base' (the base's tokenizer, which RAM Studio copies) can be reproduced.")
    method = doc.get("merge_method")
    if not isinstance(method, str) or method not in MERGEKIT_METHODS:
        raise _refuse(f"merge_method {printable(method, 40)!r} is not one RAM Studio reproduces",
                      f"Supported: {', '.join(MERGEKIT_METHODS)}.")
    rules = MERGEKIT_METHODS[method]
    if doc.get("base_model") is None:
        raise _refuse("base_model is required", "RAM Studio merges task vectors relative to a base model.")
    base = _model_ref(doc["base_model"], "base_model")
    g = doc.get("parameters") or {}
    if not isinstance(g, dict):
        raise _refuse("'parameters' must be a mapping")
    allowed = set(rules["global"]) | rules["per_model"]
    for k in g:
        if k not in allowed:
            raise _refuse(f"parameter {printable(k, 40)!r} is not one {method} takes",
                          f"{method} takes: {', '.join(sorted(allowed)) or 'none'}.")
    params = {k: _scalar(g.get(k, d), f"parameters.{k}") for k, d in rules["global"].items()}
    models = doc.get("models")
    if not isinstance(models, list) or not models:
        raise _refuse("'models' must be a non-empty list")
    if len(models) > MAX_AGENTS + 1:
        raise _refuse(f"'models' lists {len(models):,} models; a merge takes at most {MAX_AGENTS} agents")
    listed, per_model = [], []
    for i, m in enumerate(models):
        if not isinstance(m, dict) or "model" not in m or set(m) - {"model", "parameters"}:
            raise _refuse(f"models[{i}] must be a mapping with 'model' and optional 'parameters'")
        ref = _model_ref(m["model"], f"models[{i}].model")
        p = m.get("parameters") or {}
        if not isinstance(p, dict):
            raise _refuse(f"models[{i}].parameters must be a mapping")
        for k in p:
            if k not in rules["per_model"]:
                raise _refuse(f"models[{i}].parameters.{printable(k, 40)} is not a per-model parameter of {method}",
                              f"Per-model parameters of {method}: {', '.join(sorted(rules['per_model'])) or 'none'}.")
        values = {k: _scalar(p.get(k, g.get(k)), f"models[{i}].parameters.{k}") for k in rules["per_model"]
                  if p.get(k, g.get(k)) is not None}
        listed.append(ref)
        per_model.append(values)
    notes: list[str] = []
    spec = _translate(method, base, listed, per_model, params, notes)
    out_name = doc.get("out_dtype") or doc.get("dtype")
    for key in ("dtype", "out_dtype"):
        if doc.get(key) is not None and (not isinstance(doc[key], str) or doc[key] not in _DTYPES):
            raise _refuse(f"{key} {printable(doc[key], 40)!r} is not one of {', '.join(_DTYPES)}")
    spec.out_dtype = _DTYPES[out_name] if out_name else None
    if doc.get("dtype") not in (None, "float32"):
        notes.append(f"dtype {doc['dtype']}: mergekit would compute in {doc['dtype']}; RAM Studio computes task "
                     "vectors and merges in float32 from the stored values (a more precise result, not bit-identical)")
    if params.get("int8_mask"):
        notes.append("int8_mask only sets mergekit's mask dtype; it has no effect on the result")
    return MergekitConfig(spec, notes)


def parse_mergekit_yaml(text: str) -> MergeSpec:
    """The MergeSpec a mergekit YAML config describes (see read_mergekit_yaml for the notes)."""
    return read_mergekit_yaml(text).spec


def _equal(values: list[Any], what: str, method: str) -> Any:
    if len(set(values)) > 1:
        raise _refuse(f"per-model {what} differ ({', '.join(str(v) for v in values)})",
                      f"RAM Studio's {method} uses one {what} for every agent; give them all the same value.")
    return values[0]


def _translate(method: str, base: str, listed: list[str], per_model: list[dict[str, Any]],
               g: dict[str, Any], notes: list[str]) -> MergeSpec:
    """mergekit method + parameters → our method + parameters, refusing what we would compute differently."""
    agents = [(ref, p) for ref, p in zip(listed, per_model) if ref != base]
    if len(agents) < 2:
        raise _refuse(f"{len(agents)} model(s) besides base_model", "A merge needs at least two agents.")
    refs = [ref for ref, _ in agents]
    if method in ("ram", "ramplus_tl"):
        for ref, p in agents:
            if p.get("weight", 1) != 1:
                raise _refuse(f"weight {p['weight']} for {printable(ref, 60)}: mergekit's {method} ignores weights",
                              "Remove the weights (RAM Studio refuses rather than guess).")
        if method == "ram":
            return MergeSpec(base, refs, "ram", {"eps": g["epsilon"]})
        return MergeSpec(base, refs, "ram_plus", {"eps": g["epsilon"], "r": g["r"], "alpha": g["alpha"],
                                                   "rho_scope": "tensor"})
    weights = [p.get("weight") for _, p in agents]
    if any(w is None for w in weights):
        raise _refuse(f"every model needs a weight for {method} (mergekit requires it)")
    w = _equal(weights, "weights", method)
    if w <= 0:
        raise _refuse(f"weight {w} must be positive")
    n = len(agents)
    if method == "linear":
        if base in listed:
            raise _refuse("linear lists base_model among the models",
                          "RAM Studio's average is the mean of the agents; list only the agents.")
        if not g["normalize"]:
            raise _refuse("linear with normalize: false sums the models' weights",
                          "Only normalize: true (the weighted mean) is an average.")
        return MergeSpec(base, refs, "average", {})
    lam = g["lambda"]
    if method == "task_arithmetic":
        return MergeSpec(base, refs, "task_arithmetic", {"lambda": lam / n if g["normalize"] else lam * w})
    densities = [p.get("density", 1.0) for _, p in agents]
    density = _equal(densities, "densities", method)
    if method == "ties":
        if not g["normalize"]:
            raise _refuse("ties with normalize: false sums the agreeing task vectors",
                          "RAM Studio's TIES takes their mean (normalize: true, mergekit's default).")
        notes.append("TIES keeps exactly int(density·n) elements per tensor, ties at the threshold broken by index "
                     "(mergekit: max(1, int(density·n)), unstable order)")
        return MergeSpec(base, refs, "ties", {"density": density, "lambda": lam})
    # dare_linear / dare_ties
    if not g["rescale"]:
        raise _refuse(f"{method} with rescale: false", "RAM Studio's DARE always rescales kept entries by 1/(1−p).")
    if not 0 < density <= 1:
        raise _refuse(f"density {density} must be in (0, 1]")
    notes.append("DARE keeps each element with probability density and rescales by 1/density (mergekit rescales to "
                 "the L1 norm); its masks come from a seeded hash, so the drops differ from mergekit's random ones")
    drop = 1.0 - density
    if method == "dare_linear":
        return MergeSpec(base, refs, "dare_ta", {"drop_rate": drop, "lambda": lam / n if g["normalize"] else lam * w})
    if not g["normalize"]:
        raise _refuse("dare_ties with normalize: false sums the agreeing task vectors",
                      "RAM Studio's dare_ties takes their mean: set normalize: true.")
    return MergeSpec(base, refs, "dare_ties", {"drop_rate": drop, "lambda": lam})


# ---------------------------------------------------------------- ours → theirs

def to_mergekit_yaml(spec: MergeSpec, model_paths: dict[str, str] | None = None,
                     out_dtype: str | None = None) -> tuple[str | None, str]:
    """The mergekit config computing the same merge as `spec`, or (None, why not + the nearest config).

    `model_paths` maps references mergekit cannot read (demo:NAME, demo-shared:NAME) to their folders; `out_dtype` is the
    dtype the merge writes (the spec's, else the base's): the config states it, because its `dtype:
    float32` (compute like RAM Studio) would otherwise also be mergekit's output dtype."""
    import yaml

    from merging.reading.refs import demo_folder

    paths = model_paths or {}
    p = spec.params
    out_dtype = out_dtype or (None if spec.out_dtype else _stored_dtype(spec.base))
    written = spec.out_dtype or out_dtype
    if written and written not in CODE_TO_NAME:  # e.g. an F8_E4M3 base merged in its own dtype
        return None, (f"mergekit cannot write {written} weights (its out_dtype takes {', '.join(CODE_TO_NAME.values())}),"
                      " so it has no config for this merge.")

    def ref(r: str) -> str:
        return paths.get(r) or demo_folder(r)

    def config(method: str, globals_: dict[str, Any], per_model: dict[str, Any] | None = None) -> str:
        doc: dict[str, Any] = {"merge_method": method, "base_model": ref(spec.base)}
        doc["models"] = [{"model": ref(a), **({"parameters": dict(per_model)} if per_model else {})}
                         for a in spec.agents]
        if globals_:
            doc["parameters"] = globals_
        doc["dtype"] = "float32"  # RAM Studio computes in float32: ask mergekit to do the same
        if written:
            doc["out_dtype"] = CODE_TO_NAME[written]
        return yaml.safe_dump(doc, sort_keys=False)

    m = spec.method
    if m == "ram":
        return config("ram", {"epsilon": p["eps"]}), ""
    if m == "ram_plus" and p.get("rho_scope") == "tensor":
        return config("ramplus_tl", {"epsilon": p["eps"], "r": p["r"], "alpha": p["alpha"]}), ""
    if m in ("ram_plus", "ram_plus_soft"):
        nearest = config("ramplus_tl", {"epsilon": p["eps"], "r": p["r"], "alpha": p.get("alpha", 2.0)})
        rule = "the soft rule λ_t = 1 + r·ρ_t/(1+ρ_t) and " if m == "ram_plus_soft" else ""
        scope = "ρ_t counted over the whole model (global scope)" if p.get("rho_scope") == "global" else "this rule"
        return None, (f"mergekit cannot express {rule}{scope}: its ramplus_tl counts ρ_t per tensor with the clip "
                      f"rule. The nearest mergekit config follows.\n{nearest}")
    if m == "task_arithmetic":
        return config("task_arithmetic", {"lambda": p["lambda"]}, {"weight": 1.0}), ""
    if m == "average":
        return config("task_arithmetic", {"lambda": 1.0 / len(spec.agents)}, {"weight": 1.0}), ""
    if m == "ties":
        return config("ties", {"lambda": p["lambda"], "normalize": True}, {"weight": 1.0, "density": p["density"]}), (
            "mergekit keeps max(1, int(density·n)) elements per tensor and breaks ties at the threshold differently")
    if m in ("dare_ta", "dare_ties"):
        return config("dare_linear" if m == "dare_ta" else "dare_ties",
                      {"lambda": p["lambda"], **({"normalize": True} if m == "dare_ties" else {}), "rescale": True},
                      {"weight": 1.0, "density": 1.0 - p["drop_rate"]}), (
            "DARE drops are random: mergekit draws its own masks (RAM Studio's come from a seeded hash) and "
            "rescales to the L1 norm instead of by 1/(1−p), so the same config gives a different draw")
    return None, f"mergekit has no equivalent of {m}."


def _stored_dtype(ref: str) -> str | None:
    """The base's float dtype from its headers when it is on disk (no download), else None."""
    from merging.reading.checkpoint import open_checkpoint
    from merging.writing.side_files import base_float_dtype

    try:
        with open_checkpoint(ref, download=False) as ckpt:
            return base_float_dtype(ckpt)
    except (RamStudioError, OSError):
        return None

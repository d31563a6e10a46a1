"""The one place RAM Studio loads a model folder with `transformers`: never running the folder's own Python.

A Hugging Face folder may ship Python (`configuration_*.py`, `modeling_*.py`, `tokenization_*.py`) and name it
in `auto_map`; transformers runs that code when asked with `trust_remote_code=True`, and when the argument is
left unset it asks on stdin ("run the custom code? [y/N]"), so a `yes |` in a script, or a person pressing y,
runs it. Here every loader is called with `trust_remote_code=False` and `local_files_only=True`, and before
that the folder's config.json and tokenizer_config.json are read (bounded) and a folder that needs its own
code — a `model_type` transformers does not know, or a tokenizer class only its `auto_map` provides — is one
clear RamStudioError, never a question. A folder whose `model_type` transformers knows loads transformers' own
class (an `auto_map` beside it is ignored, as transformers ignores it without trust).

`tests/cli/test_custom_code.py` checks that every `from_pretrained` call in the repository passes
`trust_remote_code=False` and that, in the library, only this module calls them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from merging.common.errors import RamStudioError, first_line, printable
from merging.reading.model_folder import read_json_object

NEVER_RUN = "RAM Studio never runs a model folder's own Python"


def _code_names(auto_map: Any) -> str:
    """The files an auto_map points at (`modeling_x.Cls` → modeling_x.py), for the message."""
    refs: list[str] = []
    values = auto_map.values() if isinstance(auto_map, dict) else []
    for v in values:
        for ref in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(ref, str) and "." in ref:
                refs.append(ref.split("--")[-1].rsplit(".", 1)[0] + ".py")
    return ", ".join(dict.fromkeys(refs)) or "its own code"


def custom_code_reason(folder: Path | str) -> str | None:
    """Why loading `folder` would need the folder's own Python (None when transformers' own classes load it)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    folder = Path(folder)
    cfg = read_json_object(folder, "config.json", "model's config.json") or {}
    model_type = cfg.get("model_type")
    auto_map = cfg.get("auto_map")
    if auto_map and not (isinstance(model_type, str) and model_type in CONFIG_MAPPING):
        return (f"its config.json names model_type {printable(model_type, 60)!r}, which transformers does not know, "
                f"and points at the folder's own Python ({printable(_code_names(auto_map), 120)}) to define it")
    tok = read_json_object(folder, "tokenizer_config.json", "tokenizer config") or {}
    tok_map = tok.get("auto_map")
    tok_class = tok.get("tokenizer_class")
    if tok_map and isinstance(tok_class, str):
        known = tokenizer_class_from_name(tok_class) or tokenizer_class_from_name(tok_class.removesuffix("Fast"))
        if known is None:
            return (f"its tokenizer class {printable(tok_class, 60)!r} is defined only by the folder's own Python "
                    f"({printable(_code_names(tok_map), 120)})")
    return None


def refuse_custom_code(folder: Path | str) -> None:
    """One clear error when `folder` can only be loaded by running its own Python."""
    why = custom_code_reason(folder)
    if why:
        raise RamStudioError(f"{printable(folder)} cannot be loaded: {why}; {NEVER_RUN}.",
                             "Use a model whose architecture and tokenizer transformers implements itself (a newer "
                             "transformers may know it), or convert it to one.")


def _load(what: str, folder: Path, call) -> Any:
    """Run a transformers loader after the custom-code check; its errors become one line."""
    refuse_custom_code(folder)
    try:
        return call()
    except RamStudioError:
        raise
    except Exception as exc:  # noqa: BLE001 — whatever transformers raises, one line for the user
        raise RamStudioError(f"cannot load the {what} in {printable(folder)}: {first_line(exc)}.",
                             "Give a Hugging Face model folder with safetensors weights and a tokenizer.") from None


def load_config(folder: Path | str):
    """The folder's transformers config (its own Python never runs)."""
    from transformers import AutoConfig

    folder = Path(folder)
    return _load("config", folder, lambda: AutoConfig.from_pretrained(
        str(folder), trust_remote_code=False, local_files_only=True))


def load_causal_lm(folder: Path | str, dtype: Any = None):
    """The folder's causal LM from safetensors (never a pickle; its own Python never runs); `dtype` a torch dtype
    or "auto" (default: float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    return _load("model", folder, lambda: AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32 if dtype is None else dtype, use_safetensors=True,
        trust_remote_code=False, local_files_only=True))


def load_tokenizer(folder: Path | str):
    """The folder's tokenizer (its own Python never runs)."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    return _load("tokenizer", folder, lambda: AutoTokenizer.from_pretrained(
        str(folder), trust_remote_code=False, local_files_only=True))

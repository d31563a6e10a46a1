"""Mapping between safetensors dtype codes, torch dtypes and user-facing names."""
from __future__ import annotations

import torch

from merging.common.errors import RamStudioError

ST_TO_TORCH: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
ITEMSIZE: dict[str, int] = {k: torch.empty((), dtype=v).element_size() for k, v in ST_TO_TORCH.items()}
FLOAT_CODES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}

# Names accepted for --out-dtype and config.json's torch_dtype.
NAME_TO_CODE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}
CODE_TO_NAME = {v: k for k, v in NAME_TO_CODE.items()}


def parse_out_dtype(name: str) -> str:
    """Turn a user-facing dtype name ('bfloat16', 'bf16', 'float32', ...) into a safetensors code."""
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    key = aliases.get(name.lower(), name.lower())
    if key not in NAME_TO_CODE:
        raise RamStudioError(f"unknown output dtype {name!r}.", f"Use one of {', '.join(NAME_TO_CODE)}.")
    return NAME_TO_CODE[key]

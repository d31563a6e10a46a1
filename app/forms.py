"""The Merge page's form, filled from elsewhere (a loaded mergekit YAML, a sweep's candidate, a preset): the one
place that knows its widget keys outside the page."""
from __future__ import annotations

from typing import Any, Mapping

import streamlit as st

METHOD_KEY = "merge_method"
PRESET_KEY = "merge_preset"  # the named setting the form was filled from (presets.CUSTOM: none)
RESCALE_KEY = "merge_rescale"  # the preset's rescale factor, where it has one
TA_LAMBDA_KEY = "merge_ta_lambda"  # the λ last set for task arithmetic (Tune starts its retention chart from it)
OUT_CUSTOM = "merge_out_custom"  # the folder the user typed (None: follow the suggestion)
SHARD_KEY = "merge_shard"  # the output's shard size (SHARD_SIZES)
DTYPE_KEY = "merge_dtype"  # the output dtype (a key of DTYPES)
POLICY_KEY = "merge_policy"  # what to do with a tensor mismatch (merging.reading.compat's policies)
SHARD_SIZES = ["100MB", "500MB", "1GB", "2GB", "5GB", "10GB"]
DTYPES = {"as base": None, "BF16": "BF16", "F16": "F16", "F32": "F32"}


def param_key(method: str, name: str) -> str:
    """The widget key of one method parameter's input on the Merge page."""
    return f"param_{method}_{name}"


def fill_merge_form(method: str, values: Mapping[str, Any]) -> None:
    """Set the Merge page's method and these parameter inputs (session state: before the page draws them)."""
    st.session_state[METHOD_KEY] = method
    for name, value in values.items():
        st.session_state[param_key(method, name)] = value

"""Interoperation with other tools: mergekit configurations and the Hugging Face Hub (upload)."""

"""Interoperation with mergekit: its configurations read as ours, ours written as its (the Hub upload is
`merging/writing/hub_upload.py`)."""

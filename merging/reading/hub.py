"""Hugging Face Hub models: a repo's snapshot (from the cache, or downloaded) and its remote header metadata.

The download itself is merging/reading/hub_download.py; failures read as merging/reading/hub_errors.py says.
"""
from __future__ import annotations

from pathlib import Path

from merging.common.errors import RamStudioError
from merging.reading.hub_download import HUB_ALLOW_PATTERNS, download, plan_download
from merging.reading.hub_errors import hub_error, offline_mode


def download_snapshot(repo_id: str, revision: str | None, *, allow_download: bool = True) -> Path:
    """Find in the local cache, or download, the safetensors/config/tokenizer files of a repo. A download
    goes through `download` (resumable, checked); callers that want progress call `plan_download` and
    `download` themselves first (the CLI and the app do)."""
    import huggingface_hub as hf

    try:
        folder = hf.snapshot_download(repo_id, revision=revision, allow_patterns=HUB_ALLOW_PATTERNS,
                                      local_files_only=True)
    except Exception as exc:  # noqa: BLE001 — the client raises many types; each becomes one readable message
        if not allow_download or offline_mode():
            raise hub_error(repo_id, revision, exc) from None
        folder = download(plan_download([(repo_id, revision)]))[repo_id]
    path = Path(folder)
    if not any(path.glob("*.safetensors")):
        raise RamStudioError(
            f"Hub repo {repo_id} has no .safetensors weights (only pickle files, which are never loaded).",
            "Convert it once in a trusted environment (load with transformers, save_pretrained(..., "
            "safe_serialization=True)) and point RAM Studio at the converted folder.")
    return path


def remote_headers(repo_id: str, revision: str | None = None) -> dict:
    """Read safetensors headers of a Hub repo through HTTP range requests, without downloading weights."""
    import huggingface_hub as hf

    try:
        api = hf.HfApi()  # a fresh client: it reads the endpoint (HF_ENDPOINT) now, not at import
        meta = api.get_safetensors_metadata(repo_id, revision=revision)
        config = _remote_json(repo_id, revision, "config.json")
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 — the client raises many types; each becomes one readable message
        raise hub_error(repo_id, revision, exc) from None
    sizes = {s.rfilename: s.size for s in (info.siblings or []) if s.size is not None}
    tensors = {}
    for fname, fmeta in meta.files_metadata.items():
        for name, t in fmeta.tensors.items():
            tensors[name] = {"dtype": t.dtype, "shape": tuple(t.shape), "file": fname}
    return {"repo_id": repo_id, "revision": info.sha, "tensors": tensors, "config": config,
            "file_sizes": sizes, "gated": bool(getattr(info, "gated", False))}


def _remote_json(repo_id: str, revision: str | None, filename: str) -> dict | None:
    import huggingface_hub as hf

    from merging.reading.model_folder import read_json_object

    try:
        path = Path(hf.hf_hub_download(repo_id, filename, revision=revision))
    except hf.errors.EntryNotFoundError:
        return None
    return read_json_object(path.parent, path.name, f"{filename} of {repo_id}")

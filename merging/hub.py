"""Hugging Face Hub access: snapshot download and remote header metadata, with readable errors."""
from __future__ import annotations

from pathlib import Path

from .errors import RamStudioError

# What snapshot_download fetches: weights as safetensors only, configs, tokenizer and chat templates.
HUB_ALLOW_PATTERNS = [
    "*.safetensors", "*.json", "tokenizer*", "*.model", "*.tiktoken", "vocab.*", "merges.txt",
    "chat_template*", "*.jinja",
]


def download_snapshot(repo_id: str, revision: str | None, *, allow_download: bool = True) -> Path:
    """Download (or find in the local cache) the safetensors/config/tokenizer files of a repo."""
    import huggingface_hub as hf

    try:
        folder = hf.snapshot_download(repo_id, revision=revision, allow_patterns=HUB_ALLOW_PATTERNS,
                                      local_files_only=not allow_download)
    except Exception as exc:  # the client raises many types; each becomes one readable message
        raise hub_error(repo_id, revision, exc) from None
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
        meta = hf.get_safetensors_metadata(repo_id, revision=revision)
        config = _remote_json(repo_id, revision, "config.json")
        info = hf.model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as exc:
        raise hub_error(repo_id, revision, exc) from None
    sizes = {s.rfilename: s.size for s in (info.siblings or []) if s.size is not None}
    tensors = {}
    for fname, fmeta in meta.files_metadata.items():
        for name, t in fmeta.tensors.items():
            tensors[name] = {"dtype": t.dtype, "shape": tuple(t.shape), "file": fname}
    return {"repo_id": repo_id, "revision": info.sha, "tensors": tensors, "config": config,
            "file_sizes": sizes, "gated": bool(getattr(info, "gated", False))}


def _remote_json(repo_id: str, revision: str | None, filename: str) -> dict | None:
    import json

    import huggingface_hub as hf

    try:
        path = hf.hf_hub_download(repo_id, filename, revision=revision)
    except hf.errors.EntryNotFoundError:
        return None
    return json.loads(Path(path).read_text())


def hub_error(repo_id: str, revision: str | None, exc: Exception) -> RamStudioError:
    """Translate huggingface_hub exceptions into one clear message; never include the token."""
    import huggingface_hub.errors as e

    where = f"{repo_id}@{revision}" if revision else repo_id
    if isinstance(exc, e.GatedRepoError):
        return RamStudioError(f"Hub repo {where} is gated and no accepted token was found.",
                              "Accept its licence on the Hub, then set HF_TOKEN or run `hf auth login`.")
    if isinstance(exc, e.RepositoryNotFoundError):
        return RamStudioError(f"Hub repo {where} does not exist (or is private).",
                              "Check the id; for a private repo set HF_TOKEN or run `hf auth login`.")
    if isinstance(exc, e.RevisionNotFoundError):
        return RamStudioError(f"revision {revision!r} of Hub repo {repo_id} does not exist.",
                              "Use a branch, tag or commit hash that exists.")
    if isinstance(exc, (e.LocalEntryNotFoundError, e.OfflineModeIsEnabled)) or "offline" in str(exc).lower():
        return RamStudioError(f"cannot reach the Hugging Face Hub for {where} and it is not in the local cache.",
                              "Connect to the network (and unset HF_HUB_OFFLINE), or use a local folder.")
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return RamStudioError(f"Hub request for {where} failed: {msg}.", "Check the network and the repo id.")

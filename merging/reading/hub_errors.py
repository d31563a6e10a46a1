"""Hugging Face Hub failures in words: whether the client is offline, and one readable message per exception."""
from __future__ import annotations

from merging.common.errors import RamStudioError


def offline_mode() -> bool:
    """Whether the Hub client was told to stay offline (HF_HUB_OFFLINE, or TRANSFORMERS_OFFLINE, set)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _connection_problem(exc: BaseException) -> str | None:
    """What kept the client from the Hub, in words, when `exc` (or its cause) is a network failure."""
    import socket

    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 10:
        names = {c.__name__ for c in type(e).__mro__}
        text = str(e)
        if isinstance(e, socket.gaierror) or "Name or service not known" in text or "name resolution" in text \
                or "nodename nor servname" in text:
            return "the Hub's host name could not be resolved (no network, or no DNS)"
        if isinstance(e, ConnectionRefusedError) or "Connection refused" in text:
            return "the connection was refused"
        if isinstance(e, TimeoutError) or names & {"TimeoutException", "ConnectTimeout", "ReadTimeout", "Timeout"}:
            return "the connection timed out"
        if "ProxyError" in names:
            return "the proxy refused the connection"
        if isinstance(e, (ConnectionError, OSError)) and ("Network is unreachable" in text or "unreachable" in text):
            return "the network is unreachable"
        if names & {"ConnectError", "NetworkError", "ConnectionError"}:
            return "no connection could be made"
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def hub_error(repo_id: str, revision: str | None, exc: Exception) -> RamStudioError:
    """Translate huggingface_hub exceptions into one clear message; never include the token."""
    import huggingface_hub.errors as e
    from huggingface_hub import constants

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
    if offline_mode() and (isinstance(exc, (e.LocalEntryNotFoundError, e.OfflineModeIsEnabled))
                           or "offline" in str(exc).lower()):
        return RamStudioError(f"{where} is not in the local Hugging Face cache, and Hub access is switched off "
                              "(HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set).",
                              "Unset it to download the model, or use a local folder.")
    problem = _connection_problem(exc)
    if problem is not None or isinstance(exc, e.LocalEntryNotFoundError):
        host = constants.ENDPOINT.split("://", 1)[-1]
        return RamStudioError(f"cannot reach the Hugging Face Hub ({host}) for {where}: "
                              f"{problem or 'the request failed'}; and it is not in the local cache.",
                              "Check the network connection (and HTTPS_PROXY if you use one), or use a local folder.")
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return RamStudioError(f"Hub request for {where} failed: {msg}.", "Check the network and the repo id.")

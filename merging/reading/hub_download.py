"""Hub downloads: a plan from the repo listings (metadata only), then a resumable, checked, cancellable fetch.

Each file streams into the Hugging Face cache's `blobs/<etag>.incomplete` and becomes the blob only once its
size and hash match the Hub's; the client then links the snapshot from the blobs in place.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from merging.common.errors import Cancelled, RamStudioError, printable
from merging.common.units import format_bytes
from merging.reading.hub_errors import hub_error

# What snapshot_download fetches: weights as safetensors only, configs, tokenizer and chat templates.
HUB_ALLOW_PATTERNS = [
    "*.safetensors", "*.json", "tokenizer*", "*.model", "*.tiktoken", "vocab.*", "merges.txt",
    "chat_template*", "*.jinja",
]

PARTIAL_SUFFIX = ".incomplete"  # blobs/<etag>.incomplete: a partial download, resumed with an HTTP Range request
DOWNLOAD_MARGIN = 64 << 20
CHUNK = 1 << 20


@dataclass
class HubFile:
    """One file of a Hub repo the download needs: its blob name in the cache (the etag: the LFS sha256, or the
    git blob id), size, and what is already on disk (`cached`, or `partial` bytes of an interrupted download)."""

    repo_id: str
    commit: str
    name: str
    size: int
    etag: str
    blob: Path
    cached: bool = False
    partial: int = 0

    @property
    def remaining(self) -> int:
        return 0 if self.cached else self.size - self.partial


@dataclass
class RepoPlan:
    repo_id: str
    revision: str | None
    commit: str
    folder: Path  # the repo's folder in the Hugging Face cache (models--org--name)
    files: list[HubFile]


@dataclass
class DownloadPlan:
    """What downloading some Hub models needs, before anything is fetched: files, bytes, where they go."""

    repos: list[RepoPlan]
    cache_dir: Path

    @property
    def files(self) -> list[HubFile]:
        return [f for r in self.repos for f in r.files]

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def cached(self) -> int:
        return sum(f.size for f in self.files if f.cached)

    @property
    def partial(self) -> int:
        return sum(f.partial for f in self.files if not f.cached)

    @property
    def remaining(self) -> int:
        return sum(f.remaining for f in self.files)

    def free(self) -> int:
        """Free bytes on the disk that holds the cache."""
        where = self.cache_dir
        while not where.exists() and where != where.parent:
            where = where.parent
        return shutil.disk_usage(where).free


@dataclass
class DownloadProgress:
    """Where a download stands: the current file and the whole plan, with the measured rate and an ETA."""

    repo_id: str
    file: str
    file_done: int
    file_total: int
    done: int  # bytes of the plan on disk (cached and partial ones included)
    total: int
    fetched: int  # bytes received by this run
    rate: float  # bytes per second over the last few seconds of this run
    files_done: int
    files_total: int

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0

    @property
    def eta(self) -> float | None:
        return (self.total - self.done) / self.rate if self.rate > 0 else None


def _is_hex(text: object, lengths: tuple[int, ...]) -> bool:
    """A lowercase hex digest of one of `lengths` (git sha1: 40, sha256: 64)."""
    return isinstance(text, str) and len(text) in lengths and all(c in "0123456789abcdef" for c in text)


def _is_repo_path(path: object) -> bool:
    """A relative path inside a repo: no leading '/', no '.', '..' or empty parts, no backslash or control
    characters."""
    return (isinstance(path, str) and 0 < len(path) < 1024 and not path.startswith("/") and "\\" not in path
            and printable(path) == path and all(part not in ("", ".", "..") for part in path.split("/")))


def _matches(name: str) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(name, pattern) for pattern in HUB_ALLOW_PATTERNS)


def plan_download(repos_wanted: list[tuple[str, str | None]]) -> DownloadPlan:
    """The files the Hub repos (repo id, revision) need (metadata only: one listing per repo), and which of
    them the local cache already holds, whole or in part (`merging.reading.refs.hub_repos` turns references into
    these pairs)."""
    import huggingface_hub as hf
    from huggingface_hub import constants

    cache = Path(constants.HF_HUB_CACHE)
    repos: list[RepoPlan] = []
    for repo_id, revision in dict.fromkeys(repos_wanted):
        try:
            api = hf.HfApi()
            commit = api.model_info(repo_id, revision=revision).sha
            entries = [f for f in api.list_repo_tree(repo_id, recursive=True, revision=commit)
                       if isinstance(f, hf.hf_api.RepoFile) and _matches(f.path)]
        except Exception as exc:  # noqa: BLE001 — one readable message per failure
            raise hub_error(repo_id, revision, exc) from None
        folder = cache / f"models--{repo_id.replace('/', '--')}"
        if not _is_hex(commit, (40,)):
            raise RamStudioError(f"the Hub answered with an unexpected commit id for {repo_id} "
                                 f"({printable(commit, 80)!r}).",
                                 "Check HF_ENDPOINT: it may not be a Hugging Face Hub.")
        files = []
        for f in entries:
            etag = f.lfs.sha256 if f.lfs is not None else f.blob_id
            size = f.lfs.size if f.lfs is not None else f.size
            # The etag names the blob file in the cache and the file's path names a link in the snapshot: a
            # server could put '/' or '..' in either, so both are checked before any path is made from them.
            if not _is_hex(etag, (40, 64)) or not _is_repo_path(f.path) or type(size) is not int or size < 0:
                raise RamStudioError(f"the Hub listed {printable(f.path, 120)!r} of {repo_id} with an id, path or "
                                     "size that is not valid.",
                                     "Check HF_ENDPOINT: it may not be a Hugging Face Hub; nothing was downloaded.")
            blob = folder / "blobs" / etag
            pointer = folder / "snapshots" / commit / f.path
            cached = pointer.exists() or (blob.is_file() and blob.stat().st_size == size)
            part = blob.with_name(etag + PARTIAL_SUFFIX)
            partial = 0 if cached or not part.is_file() else min(part.stat().st_size, size)
            files.append(HubFile(repo_id, commit, f.path, int(size), etag, blob, cached, partial))
        if not any(f.name.endswith(".safetensors") for f in files):
            raise RamStudioError(
                f"Hub repo {repo_id} has no .safetensors weights (only pickle files, which are never loaded).",
                "Convert it once in a trusted environment (load with transformers, save_pretrained(..., "
                "safe_serialization=True)) and point RAM Studio at the converted folder.")
        repos.append(RepoPlan(repo_id, revision, commit, folder, files))
    return DownloadPlan(repos, cache)


class _Meter:
    """Progress bookkeeping for `download`: a rate over a sliding window of a few seconds."""

    def __init__(self, plan: DownloadPlan, progress) -> None:
        self.plan, self.progress = plan, progress
        self.done = plan.cached + plan.partial
        self.fetched = 0
        self.files_done = sum(1 for f in plan.files if f.cached)
        self.window: list[tuple[float, int]] = [(time.monotonic(), 0)]
        self.last = 0.0

    def add(self, f: HubFile, file_done: int, n: int, force: bool = False) -> None:
        self.done += n
        self.fetched += n
        now = time.monotonic()
        self.window.append((now, self.fetched))
        while len(self.window) > 2 and now - self.window[0][0] > 5.0:
            self.window.pop(0)
        if self.progress is None or (not force and now - self.last < 0.1):
            return
        self.last = now
        t0, b0 = self.window[0]
        rate = (self.fetched - b0) / (now - t0) if now > t0 else 0.0
        self.progress(DownloadProgress(f.repo_id, f.name, file_done, f.size, self.done, self.plan.total, self.fetched,
                                       rate, self.files_done, len(self.plan.files)))


def download(plan: DownloadPlan, *, progress=None, cancel: threading.Event | None = None) -> dict[str, Path]:
    """Fetch what `plan` says is missing into the Hugging Face cache, then let the client link the snapshot.

    Each file streams into `blobs/<etag>.incomplete`; an interrupted or cancelled download keeps it and the
    next call resumes with an HTTP Range request. A finished file is checked (size, and its sha256 or git blob
    hash against the etag) before it becomes the blob. `progress` gets a DownloadProgress at most every 0.1 s
    and at each file's end; setting `cancel` stops within one chunk (1 MB), raising Cancelled. Returns the
    snapshot folder of each repo id."""
    import huggingface_hub as hf

    need = plan.remaining
    if need:
        free = plan.free()
        if free < need + DOWNLOAD_MARGIN:
            raise RamStudioError(f"not enough disk space in {plan.cache_dir}: the download needs about "
                                 f"{format_bytes(need)}, {format_bytes(free)} are free.",
                                 "Free some space, or point HF_HUB_CACHE (or HF_HOME) at a bigger disk.")
    meter = _Meter(plan, progress)
    for f in plan.files:
        if f.cached:
            continue
        if cancel is not None and cancel.is_set():
            raise Cancelled(_cancel_text(meter))
        try:
            _fetch(f, meter, cancel)
        except (Cancelled, RamStudioError):
            raise
        except Exception as exc:  # noqa: BLE001 — the partial file stays for the next try
            raise hub_error(f.repo_id, f.commit, exc) from None
        f.cached, f.partial = True, 0
        meter.files_done += 1
        meter.add(f, f.size, 0, force=True)
    folders = {}
    for r in plan.repos:
        try:  # the client links the snapshot (and records its file list) from the blobs now in place
            folder = Path(hf.snapshot_download(r.repo_id, revision=r.commit, allow_patterns=HUB_ALLOW_PATTERNS))
        except Exception as exc:  # noqa: BLE001
            raise hub_error(r.repo_id, r.revision, exc) from None
        ref = r.folder / "refs" / (r.revision or "main")
        if r.revision != r.commit:
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(r.commit)  # the branch or tag now names this commit, as the client would record
        folders[r.repo_id] = folder
    return folders


def _cancel_text(meter: "_Meter") -> str:
    return (f"download cancelled; the {format_bytes(meter.done)} of {format_bytes(meter.plan.total)} already in "
            f"{meter.plan.cache_dir} are kept and the next download resumes from there.")


def _fetch(f: HubFile, meter: _Meter, cancel: threading.Event | None) -> None:
    """Stream one file into its partial blob (resuming it), verify it, and move it into place."""
    import fcntl

    import huggingface_hub as hf

    f.blob.parent.mkdir(parents=True, exist_ok=True)
    part = f.blob.with_name(f.etag + PARTIAL_SUFFIX)
    with open(part, "ab") as out:
        try:
            fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RamStudioError(f"another process is downloading {f.repo_id}/{f.name} right now.",
                                 "Wait for it to finish, then try again.") from None
        start = out.tell()
        if start > f.size:  # not ours, or a different file: start over
            out.truncate(0)
            meter.done -= start
            start = 0
        got = start
        if start < f.size:
            url = hf.hf_hub_url(f.repo_id, f.name, revision=f.commit)
            headers = {"Accept-Encoding": "identity"}
            if start:
                headers["Range"] = f"bytes={start}-"
            with _stream(url, headers) as (status, chunks):
                if start and status == 200:  # the server ignored the range: take the whole file again
                    out.truncate(0)
                    meter.done -= start
                    got = 0
                for chunk in chunks:
                    out.write(chunk)  # kept even when cancelled now: the next download resumes after it
                    got += len(chunk)
                    meter.add(f, got, len(chunk))
                    if cancel is not None and cancel.is_set() and got < f.size:
                        out.flush()
                        raise Cancelled(_cancel_text(meter))
        out.flush()
        os.fsync(out.fileno())
    if got != f.size:
        raise RamStudioError(f"the download of {f.repo_id}/{f.name} stopped at {format_bytes(got)} of "
                             f"{format_bytes(f.size)}.", "Start the download again: it resumes from there.")
    if not _content_matches(part, f):
        part.unlink(missing_ok=True)
        raise RamStudioError(f"{f.repo_id}/{f.name} arrived damaged (its hash is not the Hub's {f.etag[:12]}…); "
                             "the partial file was removed.", "Start the download again.")
    os.replace(part, f.blob)


def _content_matches(path: Path, f: HubFile) -> bool:
    """The file's sha256 (LFS etag, 64 hex digits) or git blob sha1 (40 hex digits) equals its etag."""
    import hashlib

    if len(f.etag) == 64:
        h = hashlib.sha256()
    elif len(f.etag) == 40:
        h = hashlib.sha1()
        h.update(f"blob {f.size}\0".encode())
    else:
        return True  # an etag of another form cannot be checked; the size was
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest() == f.etag


@contextlib.contextmanager
def _stream(url: str, headers: dict[str, str]):
    """GET `url` through the Hub client's own HTTP session (proxies, token, user agent), following redirects:
    yields (status code, iterator of byte chunks). Works with the httpx-based clients and the older
    requests-based ones."""
    from huggingface_hub import utils

    headers = {**utils.build_hf_headers(), **headers}
    if hasattr(utils, "http_stream_backoff"):
        with utils.http_stream_backoff("GET", url, headers=headers, follow_redirects=True) as response:
            utils.hf_raise_for_status(response)
            yield response.status_code, response.iter_bytes(CHUNK)
    else:  # requests-based huggingface_hub (< 1.0)
        response = utils.get_session().get(url, headers=headers, stream=True, allow_redirects=True, timeout=30)
        try:
            utils.hf_raise_for_status(response)
            yield response.status_code, response.iter_content(CHUNK)
        finally:
            response.close()

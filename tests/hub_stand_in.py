"""A local stand-in for the Hugging Face Hub, for tests: a real HTTP server that huggingface_hub talks to
through HF_ENDPOINT. It serves what the client and RAM Studio ask for — repo info (`/api/models/{repo}` and
`/revision/{rev}`), the file tree (`/api/models/{repo}/tree/{rev}`), and files (`/{repo}/resolve/{rev}/{file}`,
HEAD and GET, with the commit, etag and linked-size headers, and HTTP Range for resuming) — from folders on
disk. Safetensors files are served as LFS files (etag = sha256), others as git blobs (etag = git sha1).
Downloads can be throttled (bytes per second) and every request is logged, so a test can measure what was
fetched."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class Served:
    """One file of a stand-in repo."""

    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_sha1(self) -> str:
        return hashlib.sha1(f"blob {len(self.data)}\0".encode() + self.data).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1


@dataclass
class Repo:
    commit: str
    files: dict[str, Served]


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    sent: int = 0  # body bytes sent


@dataclass
class StandInHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    rate: float | None = None  # bytes per second for file bodies (None: as fast as possible)
    honour_range: bool = True
    forged_oids: dict[str, str] = field(default_factory=dict)  # file name -> the id the tree listing gives it
    log: list[Request] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def add_repo(self, repo_id: str, folder: Path) -> Repo:
        """Serve every regular file of `folder` as repo `repo_id` (one commit)."""
        files = {p.name: Served(p.read_bytes(), p.suffix == ".safetensors") for p in sorted(Path(folder).iterdir())
                 if p.is_file()}
        commit = hashlib.sha1(repo_id.encode() + b"".join(f.etag.encode() for f in files.values())).hexdigest()
        self.repos[repo_id] = Repo(commit, files)
        return self.repos[repo_id]

    def start(self) -> "StandInHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                self.route(head=True)

            def do_GET(self) -> None:
                self.route(head=False)

            def route(self, head: bool) -> None:
                path = unquote(urlparse(self.path).path)
                req = Request(self.command, path, self.headers.get("Range"))
                hub.log.append(req)
                parts = path.strip("/").split("/")
                try:
                    if parts[:2] == ["api", "models"]:
                        return self.api(parts[2:], head)
                    if len(parts) >= 5 and parts[2] == "resolve":
                        return self.resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), head, req)
                except KeyError:
                    pass
                self.json({"error": "Repository Not Found"}, 404, {"X-Error-Code": "RepoNotFound"})

            def json(self, doc, status: int = 200, extra: dict | None = None) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def repo(self, repo_id: str, rev: str | None) -> Repo:
                repo = hub.repos[repo_id]
                if rev not in (None, "main", repo.commit):
                    raise KeyError(rev)
                return repo

            def api(self, rest: list[str], head: bool) -> None:
                repo_id = "/".join(rest[:2])
                tail = rest[2:]
                rev = None
                if tail[:1] in (["revision"], ["tree"]):
                    rev = unquote(tail[1]) if len(tail) > 1 else "main"
                repo = self.repo(repo_id, rev)
                if tail[:1] == ["tree"]:
                    entries = [{"type": "file", "oid": hub.forged_oids.get(name, f.git_sha1), "size": len(f.data),
                                "path": name,
                                **({"lfs": {"oid": hub.forged_oids.get(name, f.sha256), "size": len(f.data),
                                                          "pointerSize": 134}} if f.lfs else {})}
                               for name, f in repo.files.items()]
                    return self.json(entries)
                siblings = [{"rfilename": name, "size": len(f.data), "blobId": f.git_sha1,
                             **({"lfs": {"sha256": f.sha256, "size": len(f.data),
                                         "pointerSize": 134}} if f.lfs else {})}
                            for name, f in repo.files.items()]
                return self.json({"_id": repo.commit[:24], "id": repo_id, "modelId": repo_id, "sha": repo.commit,
                                  "private": False, "gated": False, "disabled": False, "downloads": 0, "likes": 0,
                                  "tags": [], "library_name": "transformers", "siblings": siblings,
                                  "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z"})

            def resolve(self, repo_id: str, rev: str, name: str, head: bool, req: Request) -> None:
                repo = self.repo(repo_id, unquote(rev))
                if name not in repo.files:
                    return self.json({"error": "Entry not found"}, 404, {"X-Error-Code": "EntryNotFound",
                                                                         "X-Repo-Commit": repo.commit})
                f = repo.files[name]
                start, end = 0, len(f.data) - 1
                status = 200
                if req.range and hub.honour_range and req.range.startswith("bytes="):
                    a, _, b = req.range[6:].partition("-")
                    start = int(a or 0)
                    end = min(int(b), end) if b else end
                    status = 206
                body = f.data[start:end + 1]
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("X-Repo-Commit", repo.commit)
                self.send_header("ETag", f'"{f.etag}"')
                if f.lfs:
                    self.send_header("X-Linked-Etag", f'"{f.sha256}"')
                    self.send_header("X-Linked-Size", str(len(f.data)))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(f.data)}")
                self.end_headers()
                if head:
                    return
                step = 16 << 10
                try:
                    for i in range(0, len(body), step):
                        self.wfile.write(body[i:i + step])
                        req.sent += len(body[i:i + step])
                        if hub.rate:
                            time.sleep(step / hub.rate)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True, name="stand-in-hub").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def body_bytes(self, name: str) -> list[tuple[str | None, int]]:
        """(Range header, bytes sent) of every GET of a file with this name."""
        return [(r.range, r.sent) for r in self.log if r.method == "GET" and r.path.endswith("/" + name)
                and "/resolve/" in r.path]

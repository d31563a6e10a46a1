"""Model references: local folders, Hugging Face repo ids (`org/name@rev`) and the bundled demo (`demo:name`)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import RamStudioError, printable

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_DEMO_ROOT = REPO_ROOT / "assets" / "demo" / "models"
DEMO_PREFIX = "demo:"
_HUB_RE = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")


@dataclass(frozen=True)
class ModelRef:
    """A parsed model reference; `label` is the short name used in tables and charts."""

    raw: str
    kind: str  # "local" | "hub" | "demo"
    path: Path | None = None
    repo_id: str | None = None
    revision: str | None = None

    @property
    def label(self) -> str:
        """Demo name, repo name or folder name, with control characters escaped (it is shown everywhere)."""
        if self.kind == "demo":
            text = self.raw[len(DEMO_PREFIX):]
        elif self.kind == "hub":
            text = self.repo_id.split("/", 1)[1] if self.repo_id else self.raw
        else:
            text = self.path.name if self.path else self.raw
        return printable(text, 120)


def parse_ref(text: str) -> ModelRef:
    """Classify a reference: an existing path wins, then `demo:NAME`, then `org/name[@rev]`."""
    text = (text or "").strip()
    if not text:
        raise RamStudioError("empty model reference.", "Give a folder path, a Hub id like org/name, or demo:base.")
    if text.startswith(DEMO_PREFIX):
        name = text[len(DEMO_PREFIX):]
        return ModelRef(text, "demo", path=demo_root() / name)
    path = Path(text).expanduser()
    try:
        exists = len(text) < 4096 and path.exists()
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL: no such path
        exists = False
    if exists:
        return ModelRef(text, "local", path=path.resolve())
    m = _HUB_RE.match(text)
    if m and not text.startswith((".", "/", "~")):
        return ModelRef(text, "hub", repo_id=m["repo"], revision=m["rev"])
    raise RamStudioError(f"model path {printable(text, 200)!r} does not exist.",
                         "Check the path, or use a Hub id (org/name[@revision]) or demo:base.")


def hub_repos(refs: list[str]) -> list[tuple[str, str | None]]:
    """(repo id, revision) of every Hub reference among `refs`, once each; other references are skipped
    (a reference that cannot be parsed too: the command that reads it reports it)."""
    out: list[tuple[str, str | None]] = []
    for ref in refs:
        try:
            r = parse_ref(ref)
        except RamStudioError:
            continue
        if r.kind == "hub" and r.repo_id and (r.repo_id, r.revision) not in out:
            out.append((r.repo_id, r.revision))
    return out


def demo_root() -> Path:
    """Folder of the demo models: $RAM_STUDIO_DEMO_ROOT (e.g. a quick build in tests) or the bundled one."""
    override = os.environ.get("RAM_STUDIO_DEMO_ROOT")
    return Path(override) if override else BUNDLED_DEMO_ROOT


def demo_names() -> list[str]:
    """Names of the demo models that are present (base first)."""
    root = demo_root()
    if not root.is_dir():
        return []
    names = sorted(p.name for p in root.iterdir() if (p / "config.json").exists())
    return sorted(names, key=lambda n: (n != "base", n))


def resolve(ref: ModelRef | str | Path, *, download: bool = True) -> Path:
    """Return a local folder holding the model, downloading a Hub snapshot when allowed."""
    if not isinstance(ref, ModelRef):
        ref = parse_ref(str(ref))
    if ref.kind == "demo":
        if not (ref.path and ref.path.is_dir()):
            have = ", ".join(f"demo:{n}" for n in demo_names()) or "none (build it: python -m assets.demo.build)"
            raise RamStudioError(f"unknown demo model {ref.raw!r}.", f"Available: {have}.")
        return ref.path
    if ref.kind == "local":
        if not ref.path.is_dir():
            raise RamStudioError(f"{ref.path} is a file, not a model folder.",
                                 "Point at the folder holding config.json and the .safetensors files.")
        return ref.path
    from .hub import download_snapshot  # imported lazily: only Hub references need the client
    return download_snapshot(ref.repo_id, ref.revision, allow_download=download)

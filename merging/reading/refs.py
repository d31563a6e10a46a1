"""Model references: local folders, Hugging Face repo ids (`org/name@rev`) and the two bundled demo trios
(`demo:name`, `demo-shared:name`). A demo reference only names a folder; what the demo's models are
(their tasks, their evaluation) lives with the demo, never here."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from merging.common.errors import RamStudioError, printable

REPO_ROOT = Path(__file__).resolve().parents[2]
BUNDLED_DEMO_ROOT = REPO_ROOT / "assets" / "demo" / "models"
DEMO_PREFIX = "demo:"
DEMO_SHARED_PREFIX = "demo-shared:"
# prefix -> (bundled folder, environment variable that points it elsewhere, e.g. at a quick build in tests)
DEMO_TRIOS: dict[str, tuple[Path, str]] = {
    DEMO_PREFIX: (BUNDLED_DEMO_ROOT, "RAM_STUDIO_DEMO_ROOT"),
    DEMO_SHARED_PREFIX: (REPO_ROOT / "assets" / "demo" / "models-shared", "RAM_STUDIO_DEMO_SHARED_ROOT"),
}
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
            text = self.raw[len(demo_prefix(self.raw) or ""):]
        elif self.kind == "hub":
            text = self.repo_id.split("/", 1)[1] if self.repo_id else self.raw
        else:  # the folder's name as the user typed it: a symlink keeps its own name, not its target's
            typed = Path(self.raw.strip()).expanduser().name
            text = typed if typed not in ("", ".", "..") else (self.path.name if self.path else self.raw)
        return printable(text, 120)


def parse_ref(text: str) -> ModelRef:
    """Classify a reference: an existing path wins, then `demo:NAME`, then `org/name[@rev]`."""
    text = (text or "").strip()
    if not text:
        raise RamStudioError("empty model reference.", "Give a folder path, a Hub id like org/name, or demo:base.")
    prefix = demo_prefix(text)
    if prefix:
        return ModelRef(text, "demo", path=demo_root(prefix) / text[len(prefix):])
    path = Path(text).expanduser()
    try:
        exists = len(text) < 4096 and path.exists()
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL: no such path
        exists = False
    if exists:
        from merging.reading.model_folder import refuse_linked_snapshot

        refuse_linked_snapshot(path, path.resolve())  # before the link is resolved away
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


def demo_prefix(text: str) -> str | None:
    """The demo trio prefix a reference starts with (`demo:` or `demo-shared:`), else None."""
    return next((p for p in DEMO_TRIOS if text.startswith(p)), None)


def demo_root(prefix: str = DEMO_PREFIX) -> Path:
    """Folder of one demo trio's models: its environment override (e.g. a quick build in tests:
    $RAM_STUDIO_DEMO_ROOT, $RAM_STUDIO_DEMO_SHARED_ROOT) or the bundled one."""
    bundled, env = DEMO_TRIOS[prefix]
    override = os.environ.get(env)
    return Path(override) if override else bundled


def demo_folder(ref: str) -> str:
    """A demo reference's folder as a path string (tools that cannot read `demo:NAME`); other references
    pass through unchanged."""
    prefix = demo_prefix(ref)
    return str(demo_root(prefix) / ref[len(prefix):]) if prefix else ref


def demo_names(prefix: str = DEMO_PREFIX) -> list[str]:
    """Names of one demo trio's models that are present (base first)."""
    root = demo_root(prefix)
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
            prefix = demo_prefix(ref.raw) or DEMO_PREFIX
            build = "python -m demo.build" + (" --suite shared" if prefix == DEMO_SHARED_PREFIX else "")
            have = ", ".join(f"{prefix}{n}" for n in demo_names(prefix)) or f"none (build it: {build})"
            raise RamStudioError(f"unknown demo model {ref.raw!r}.", f"Available: {have}.")
        return ref.path
    if ref.kind == "local":
        if not ref.path.is_dir():
            raise RamStudioError(f"{ref.path} is a file, not a model folder.",
                                 "Point at the folder holding config.json and the .safetensors files.")
        return ref.path
    from merging.reading.hub import download_snapshot
    return download_snapshot(ref.repo_id, ref.revision, allow_download=download)

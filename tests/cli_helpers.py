"""Running the CLI in a test, and the hostile inputs several test modules share."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ram_studio.cli import main
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


def run(capsys, *argv) -> tuple[int, str, str]:
    """Run the CLI in-process; a failure must be exactly one line `error: …` and never a traceback."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    if code != 0:
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return code, out, err

def merge_argv(base, agents, out, *extra):
    return ["merge", base, *agents, "--method", "ram", "--out", out, "--quiet", *extra]


def no_leftovers(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if ".partial-" in p.name or p.name.endswith(".lock")]


def dead_pid() -> int:
    """The id of a process that has exited (for lock files and markers that name a dead writer)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def unshare(script: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a shell `script` in a private mount namespace (mounts vanish with it): bind mounts and mount points
    without touching the machine's. Skips when the kernel or the sandbox does not allow it."""
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("user and mount namespaces are not available here (unshare)")
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def cli_line(*argv) -> str:
    import shlex

    return " ".join(shlex.quote(str(a)) for a in [sys.executable, "-m", "ram_studio", *argv])


def cache_layout(root: Path, model: Path, links: dict[str, str], blobs_to: Path | None = None) -> Path:
    """A Hugging Face cache entry `root/models--org--x` whose snapshot holds `model`'s files as regular files,
    plus links named in `links` (name -> link target); `blobs` is a link to `blobs_to` when given."""
    repo = root / "models--org--x"
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    if blobs_to is not None:
        (repo / "blobs").symlink_to(blobs_to)
    else:
        (repo / "blobs").mkdir()
    for f in model.iterdir():
        if f.name not in links:
            shutil.copyfile(f, snap / f.name)
    for name, target in links.items():
        (snap / name).symlink_to(target)
    return snap


def main_capture(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


HOSTILE_TENSORS = ['=HYPERLINK("http://evil.example/x","click")', "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)",
                   "\tlead", "model.bidi\u202eevil.weight", "![x](http://127.0.0.2:9/b.png) [Click to fix](http://x)"]


def hostile_family(root: Path, names=HOSTILE_TENSORS, dtype=torch.float32) -> list[Path]:
    g = torch.Generator().manual_seed(3)
    base = {n: torch.randn(64, generator=g) for n in names}
    folders = []
    for i in range(3):
        f = root / f"m{i}"
        f.mkdir(parents=True)
        t = base if i == 0 else {n: v + torch.randn(64, generator=g) * (torch.rand(64, generator=g) < 0.5)
                                 for n, v in base.items()}
        save_file({n: v.to(dtype) for n, v in t.items()}, f / "model.safetensors", metadata={"format": "pt"})
        (f / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
        folders.append(f)
    return folders

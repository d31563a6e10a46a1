"""Running the README's and the docs' examples in a checkout leaves no untracked folder behind: every output
folder they name (`--out merged`, `out="merged"`) is one git ignores."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def named_outputs() -> dict[str, set[str]]:
    """Every output folder an example names, by the file that names it (relative folders only: an absolute or a
    temporary one is the reader's own; DIR and FILE are placeholders)."""
    found: dict[str, set[str]] = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        names = set(re.findall(r"--out[ =]([\w./-]+)", text)) | set(re.findall(r"\bout=[\"']([\w./-]+)[\"']", text))
        names = {n for n in names if not n.startswith(("/", "$", "~")) and n not in (".", "..") and not n.isupper()}
        if names:
            found[doc.name] = names
    return found


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_every_example_output_folder_is_ignored_by_git():
    found = named_outputs()
    assert "merged" in found.get("README.md", set())  # the README's own example is among them
    for doc, names in found.items():
        for name in names:
            if subprocess.run(["git", "ls-files", name], cwd=ROOT, capture_output=True, text=True).stdout:
                continue  # a folder of the repository (the screenshots' docs/images): written on purpose
            probe = f"{name.rstrip('/')}/model.safetensors"
            done = subprocess.run(["git", "check-ignore", "-q", probe], cwd=ROOT)
            assert done.returncode == 0, f"{doc}: `{name}` would be left untracked in a checkout"

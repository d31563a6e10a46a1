"""The Hub upload (merging/writing/hub_upload.py) sends only what the merge wrote, to a valid repository id."""
from __future__ import annotations

import pytest

from merging.common.errors import RamStudioError
from tests.paths import REPO_ROOT

DEMO = REPO_ROOT / "assets" / "demo" / "models"
DEMO_REFS = [str(DEMO / "base")] + [str(DEMO / a) for a in ("code", "tool", "memory")]


@pytest.mark.skipif(not (DEMO / "base").is_dir(), reason="the demo models are not built")
def test_hub_upload_sends_only_what_the_merge_wrote(tmp_path, monkeypatch):
    """A bad repository id and a file changed after the merge are refused before anything is sent (the
    endpoint here accepts no connection: reaching it would be a different error)."""
    from merging.merge import merge_to_folder
    from merging.recipe import MergeSpec
    from merging.writing.hub_upload import check_repo_id, upload

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    for bad in ("", "  ", "just-a-name"):
        with pytest.raises(RamStudioError, match="owner/name"):
            check_repo_id(bad)
    assert check_repo_id(" me/merged ") == "me/merged"
    res = merge_to_folder(MergeSpec(DEMO_REFS[0], DEMO_REFS[1:], "average", {}, str(tmp_path / "out")))
    card = res.out / "README.md"
    card.write_text(card.read_text() + "changed\n")
    with pytest.raises(RamStudioError, match="no longer what the merge wrote"):
        upload(res.written, "me/merged", True, None)

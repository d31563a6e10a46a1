"""Upload a finished merge to the Hugging Face Hub: exactly the files the merge wrote, each checked as it is sent.

The app's Merge page calls it from its push form. The token is used for this one call and never stored or
shown; the client's errors become one readable line (merging.reading.hub.hub_error)."""
from __future__ import annotations

from merging.common.errors import RamStudioError
from merging.writing.written import WrittenFolder, open_file

COMMIT_MESSAGE = "Upload merge from RAM Studio"


def check_repo_id(repo: str) -> str:
    """The repository id as owner/name, or a readable error."""
    repo = repo.strip()
    if not repo or "/" not in repo:
        raise RamStudioError("give the repository as owner/name.", "For example your-name/merged-agents.")
    return repo


def upload(written: WrittenFolder, repo: str, private: bool, token: str | None) -> str:
    """Create `repo` if needed and commit every file of `written` in one commit, never the folder path (a file
    changed since the merge wrote it is refused before anything is sent); returns the commit's URL."""
    import huggingface_hub as hf

    repo = check_repo_id(repo)
    handles = [open_file(written, f) for f in written.files]  # refused here if anything changed
    try:
        api = hf.HfApi(token=token)
        api.create_repo(repo, private=private, exist_ok=True)
        info = api.create_commit(repo, [hf.CommitOperationAdd(f.name, h) for f, h in zip(written.files, handles)],
                                 commit_message=COMMIT_MESSAGE)
    except Exception as exc:  # noqa: BLE001 — the client's errors never contain the token; one line
        from merging.reading.hub import hub_error

        raise hub_error(repo, None, exc) from None
    finally:
        for h in handles:
            h.close()
    return str(getattr(info, "commit_url", repo))

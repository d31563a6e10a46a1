"""The Fisher pass loads each agent with transformers, through the same loaders as `evaluate`: an agent whose tokenizer
exists only in its folder's own Python (an `auto_map` to its `tokenization_*.py`, code that would leave a marker)
makes `merge --method fisher` one line and exit 2, even with "y" waiting on stdin; no code runs, nothing is written."""
from __future__ import annotations

from tests.cli.test_custom_code import (
    DEMO,
    cli,
    custom_code_folder,
    refused_without_running,
)
from tests.factory import checksums


def test_a_fisher_merge_never_runs_an_agents_code(tmp_path):
    agent = custom_code_folder(tmp_path, tokenizer_only=True, model="code")
    before = checksums([agent])
    proc = cli(["merge", DEMO / "base", agent, DEMO / "tool", "--method", "fisher", "--fisher-tasks", "code,tool",
                "--fisher-examples", "2", "--out", tmp_path / "out", "--quiet"], tmp_path)
    refused_without_running(proc, agent, tmp_path)
    assert checksums([agent]) == before and not (tmp_path / "out").exists()

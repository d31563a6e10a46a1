"""The smaller points — the duplicate-agent error's hint, ./merged-models/ ignored by git, a
symlinked folder labelled with the name typed, the Fig. 3 estimate from the model size (the app's side is in
tests/test_app_state.py with the soft-rule subtitles, the toy's titles and the offline error)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ram_studio.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("which", ["twice", "base"])
def test_the_duplicate_agent_error_says_only_what_is_wrong(capsys, family, tmp_path, which):
    base, agents = family
    given = [agents[0], agents[0]] if which == "twice" else [agents[0], base]
    code = main(["merge", str(base), *map(str, given), "--method", "ram", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert ("same model as agent" if which == "twice" else "base model itself") in err
    assert "architecture" not in err and "Give each agent once" in err, err


def test_merged_models_folder_is_ignored_by_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    text = (ROOT / "app" / "views" / "merge.py").read_text()
    assert 'DEFAULT_ROOT = "merged-models"' in text
    probe = subprocess.run(["git", "check-ignore", "-q", "merged-models/demo-ram_plus-0123abcd/model.safetensors"],
                           cwd=ROOT)
    assert probe.returncode == 0, "./merged-models/ is not in .gitignore"


def test_a_symlinked_model_folder_is_labelled_with_the_name_typed(family, tmp_path):
    from merging.reading.checkpoint import open_checkpoint
    from merging.reading.compat import ModelHeaders, check_compatibility
    from merging.reading.refs import parse_ref

    base, agents = family
    link = tmp_path / "Qwen2.5-7B-Instruct-ToolRL-grpo-cold"
    link.symlink_to(agents[1], target_is_directory=True)
    ref = parse_ref(str(link))
    assert ref.label == link.name and ref.path == agents[1].resolve()  # read from the target, named as typed
    assert parse_ref(str(link) + "/").label == link.name
    with open_checkpoint(str(link)) as ckpt:
        assert ModelHeaders.from_checkpoint(ckpt).label == link.name
    with open_checkpoint(str(base)) as b, open_checkpoint(str(link)) as a, open_checkpoint(str(agents[1])) as t:
        report = check_compatibility(ModelHeaders.from_checkpoint(b),
                                     [ModelHeaders.from_checkpoint(a), ModelHeaders.from_checkpoint(t)])
    assert any(m.kind == "duplicate" for m in report.mismatches)  # a link and its target are still one model


def test_fig3_estimate_grows_with_the_model():
    from demo.fig3 import estimate_seconds

    demo = estimate_seconds(3, 328_512, 660_944, [300, 300, 300])
    assert 3 < demo < 60  # the demo's job took 12 s here
    bigger = estimate_seconds(3, 500_000_000, 1_000_000_000, [300, 300, 300])
    assert bigger > 100 * demo
    assert estimate_seconds(3, 328_512, 660_944, [300, 300, 300], 1200) > demo  # base and agents scored too

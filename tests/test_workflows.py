"""Views are views: the workflows the app's pages call live below the app and work without it —
the Fig. 3 experiment, the Hub upload, a mergekit YAML read into form values, and CLI flags from Param.flag."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from merging.common.errors import RamStudioError

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "assets" / "demo" / "models"
DEMO_REFS = [str(DEMO / "base")] + [str(DEMO / a) for a in ("code", "tool", "memory")]


def test_param_flags_are_the_inverse_of_the_cli_parser():
    """Every parameter of every method written as flags (Param.flag) reads back as the same parameters."""
    from merging.methods import METHODS
    from ram_studio.cli import build_parser
    from ram_studio.commands.merge import param_flags, params_from_args

    for method in METHODS.values():
        params = {p.name: (True if p.kind is bool else p.choices[-1] if p.choices else
                           "code" if p.kind is str else p.kind(p.default or 1)) for p in method.params}
        args = build_parser().parse_args(["merge", "b", "a1", "a2", "--method", method.name, "--out", "o",
                                          *param_flags(params)])
        back = params_from_args(args)
        assert {k: str(v) for k, v in back.items()} == {k: str(v) for k, v in params.items()}, method.name
    assert param_flags({"dilute": False, "drop_rate": 0.3}) == ["--no-dilute", "--drop-rate", "0.3"]


def test_mergekit_yaml_becomes_form_values():
    from merging.interop.mergekit_form import form_values, read_mergekit_form

    form = read_mergekit_form("merge_method: ram\nbase_model: org/base\nmodels:\n  - model: org/a\n"
                              "  - model: org/b\nparameters:\n  epsilon: 0.001\n")
    assert (form.spec.method, form.spec.base, form.spec.agents) == ("ram", "org/base", ["org/a", "org/b"])
    assert form.values == {"eps": 0.001, "eps_steps": 0.0} and form.summary == "eps=0.001"  # the rest at defaults
    assert form_values("unique_only", {"dilute": True}) == {"eps": 1e-5, "agent": "", "dilute": True}
    with pytest.raises(RamStudioError):
        read_mergekit_form("merge_method: no_such_method\nmodels: []\n")


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


def test_fig3_experiment_rows_in_the_cli_order(monkeypatch, tmp_path):
    """run_experiment (shared by `python -m demo.fig3` and the app): references on every split first,
    then per agent the whole and the ÷ N merge on every split; the merges are real unique_only merges."""
    if not (DEMO / "base").is_dir():
        pytest.skip("the demo models are not built")
    from demo import evaluate, fig3
    from merging.recipe import read_recipe

    seen = []

    def scored(folder, tasks, split="test", limit=None):
        recipe = Path(folder) / "ram_recipe.json"
        spec = read_recipe(Path(folder))[0] if recipe.exists() else None
        seen.append((None if spec is None else (spec.params["agent"], spec.params["dilute"]), tuple(tasks), split))
        return pd.DataFrame({"task": list(tasks), "subset": "all", "n": 10, "correct": 5, "accuracy": 0.5})

    monkeypatch.setattr(evaluate, "evaluate_model", scored)
    steps = []
    tidy = fig3.run_experiment(DEMO_REFS[0], DEMO_REFS[1:3], splits=("validation", "test"),
                               step=lambda f, t: steps.append((f, t)))
    assert list(tidy.columns) == fig3.COLUMNS
    order = list(zip(tidy["variant"], tidy["agent"], tidy["split"]))
    assert order[:3] == [("base", "", "validation")] * 3  # the base on every task
    assert order[3:5] == [("agent", "code", "validation"), ("agent", "tool", "validation")]
    assert order[10:14] == [("unique", "code", "validation"), ("unique", "code", "test"),
                            ("unique_div_N", "code", "validation"), ("unique_div_N", "code", "test")]
    merged = [s for s in seen if s[0] is not None]
    assert [m[0] for m in merged[::2]] == [("0", False), ("0", True), ("1", False), ("1", True)]
    assert steps[-1] == (1.0, "14 steps done") and all(b[0] >= a[0] for a, b in zip(steps, steps[1:]))
    app_rows = fig3.percent_rows(tidy)
    assert list(app_rows.columns) == fig3.PERCENT_COLUMNS and (app_rows["accuracy"] == 50.0).all()

    acc = tmp_path / "accuracy.csv"
    acc.write_text("model,split,task,subset,n,correct,accuracy\nbase,test,code,all,10,3,0.3\n"
                   "code,test,code,all,10,9,0.9\n")
    refs = fig3.reference_rows(acc, ["code"], {"code": ["code"]})
    assert list(zip(refs["variant"], refs["agent"])) == [("base", ""), ("agent", "code")]
    assert fig3.reference_rows(acc, ["code", "tool"], {"code": ["code"], "tool": ["tool"]}) is None

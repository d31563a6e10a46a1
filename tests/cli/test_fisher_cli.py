"""`ram-studio merge --method fisher` and `sweep` with Fisher candidates end to end on the bundled demo: each agent's
Fisher computed once into the cache and reused, the recipe records its source and `run` reproduces the merge bit
for bit; a model or task a Fisher cannot be computed for is one line and exit 2."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ram_studio.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "assets" / "demo" / "models"
REFS = ["demo:base", "demo:code", "demo:tool", "demo:memory"]
LM_TASKS = ROOT / "assets" / "demo" / "lm_eval_tasks"


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def one_line_error(code: int, err: str, fragment: str) -> None:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and lines and fragment in lines[0], err
    assert "Traceback" not in err


def test_merge_records_the_fisher_and_run_reproduces_it(capsys, tmp_path, monkeypatch):
    from evaluation.fisher_cache import fisher_dir

    out = tmp_path / "fisher-merge"
    code, err = run(capsys, "merge", *REFS, "--method", "fisher", "--lambda", "0.9", "--fisher-examples", "4",
                    "--fisher-rule", "reference", "--out", str(out))
    assert code == 0, err
    assert "fisher:" in err  # the Fisher pass's progress lines
    recipe = json.loads((out / "ram_recipe.json").read_text())
    rec = recipe["fisher"]
    assert rec["origin"] == {"backend": "demo", "suite": "demo"} and rec["rule"] == "reference" and rec["n"] == 4
    assert [a["task"] for a in rec["agents"]] == ["code", "tool", "memory"]
    assert all(a["split"] == "train" and len(a["key"]) == 32 for a in rec["agents"])
    assert all(a["weights_xxh3_128"] == i["weights_xxh3_128"] for a, i in zip(rec["agents"], recipe["inputs"][1:]))
    assert recipe["spec"]["params"] == {"lambda": 0.9, "fisher_examples": 4, "fisher_rule": "reference",
                                        "fisher_floor": 1e-6}
    card = (out / "README.md").read_text()
    assert "diagonal Fisher over N = 4 examples" in card and "mergekit has no equivalent of fisher" in card
    cached = sorted(p.name for p in fisher_dir().iterdir())
    assert len([p for p in cached if p.endswith(".safetensors")]) == 3

    monkeypatch.chdir(tmp_path)
    import evaluation.fisher as fisher_mod

    monkeypatch.setattr(fisher_mod, "fisher_pass", lambda *a, **k: pytest.fail("the recipe's Fisher was recomputed"))
    code, err = run(capsys, "run", str(out), "--out", str(tmp_path / "again"), "--quiet")
    assert code == 0, err
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()

    recipe["fisher"]["agents"][0]["key"] = "0" * 32  # a recipe whose Fisher is not the one computed now
    (tmp_path / "edited.json").write_text(json.dumps(recipe))
    code, err = run(capsys, "run", str(tmp_path / "edited.json"), "--out", str(tmp_path / "x"), "--quiet")
    one_line_error(code, err, "the Fisher this recipe recorded differs")
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def renamed(tmp_path_factory) -> list[str]:
    """The demo models under names that are no task's."""
    root = tmp_path_factory.mktemp("renamed")
    return [str(shutil.copytree(DEMO / n, root / f"m_{n}")) for n in ("base", "code", "tool", "memory")]


@pytest.mark.parametrize("extra,fragment", [
    ((), "cannot tell which task agent m_code was trained on"),
    (("--fisher-tasks", "code,tool"), "2 Fisher task(s) for 3 agents"),
    (("--fisher-tasks", "code,tool,poetry"), "unknown demo task 'poetry'"),
    (("--fisher-lm-eval", "ram_demo_code_validation,ram_demo_tool,ram_demo_memory", "--include-path", str(LM_TASKS)),
     "has no training split"),
    (("--fisher-lm-eval", "ram_demo_code,ram_demo_tool,ram_demo_memory", "--include-path", str(LM_TASKS),
      "--fisher-examples", "3000"), "has 2048 examples in its train split; the Fisher asks for 3000"),
    (("--fisher-lm-eval", "ram_demo", "--include-path", str(LM_TASKS)), "1 Fisher task(s) for 3 agents"),
    (("--fisher-tasks", "code,tool,memory", "--fisher-lm-eval", "ram_demo_code"), "excludes --fisher-tasks"),
])
def test_data_a_fisher_cannot_use_is_one_line(capsys, tmp_path, renamed, extra, fragment):
    if "--fisher-lm-eval" in extra:
        pytest.importorskip("lm_eval")
    code, err = run(capsys, "merge", *renamed, "--method", "fisher", "--fisher-examples", "2", "--out",
                    str(tmp_path / "o"), "--quiet", *extra)
    one_line_error(code, err, fragment)
    assert not (tmp_path / "o").exists()


def test_a_model_the_evaluator_cannot_run_is_one_line(capsys, tmp_path, family):
    base, agents = family  # tiny real Qwen2 models whose tokenizer cannot write the demo's prompts
    code, err = run(capsys, "merge", str(base), *map(str, agents), "--method", "fisher", "--fisher-tasks",
                    "code,tool,memory", "--fisher-examples", "2", "--out", str(tmp_path / "o"), "--quiet")
    one_line_error(code, err, "is not a demo-compatible model")


def test_fisher_flags_belong_to_the_fisher_method(capsys, tmp_path):
    code, err = run(capsys, "merge", *REFS, "--method", "ram", "--fisher-tasks", "code,tool,memory", "--out",
                    str(tmp_path / "o"), "--quiet")
    one_line_error(code, err, "are the data of --method fisher")


def test_sweep_varies_lambda_and_n_from_one_pass_per_agent(capsys, tmp_path, monkeypatch):
    import evaluation.fisher as fisher_mod

    passes = []
    real = fisher_mod.fisher_pass
    monkeypatch.setattr(fisher_mod, "fisher_pass", lambda *a, **k: passes.append(a[5]) or real(*a, **k))
    report = tmp_path / "sweep.json"
    code, err = run(capsys, "sweep", *REFS, "--try", "fisher lambda=0.5,1.0 fisher_examples=2,4 fisher_rule=reference",
                    "--limit", "4", "--no-references", "--json", str(report), "--quiet")
    assert code == 0, err
    assert passes == [[2, 4]] * 3  # one pass per agent, snapshots at both Ns
    doc = json.loads(report.read_text())
    valid = [c for c in doc["candidates"] if c["split"] == "validation"]
    assert len(valid) == 4
    by_n = {c["params"]["fisher_examples"]: c["fisher_s"] for c in valid}
    assert 0 < by_n[2] < by_n[4]  # the Fisher pass's seconds to each N, all agents
    assert all(c["merge_s"] > 0 for c in valid)

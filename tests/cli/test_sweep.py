"""`ram-studio sweep`: grids checked against the declarations, the paper's protocol (selection never sees a test
score), the JSON/CSV it writes, what it keeps, resume after an interrupt, and bad input (one line, exit 2,
nothing written)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from demo.evaluator import DemoEvaluator
from evaluation.base import Scores
from evaluation.executors import LocalExecutor
from evaluation.grid import Candidate, Ref, grids_from_yaml, parse_try, stages
from evaluation.store import ScoreStore
from evaluation.sweep import Entry, SweepSpec, run_sweep, select
from merging.common.errors import Cancelled, RamStudioError
from ram_studio.cli import main
from tests.paths import REPO_ROOT

REPO = REPO_ROOT
DEMO = ["demo:base", "demo:code", "demo:tool", "demo:memory"]
LIMIT = 4  # examples per task and split: enough to rank candidates, quick to score
FAST = ["--tasks", "code,memory"]  # the tasks with short answers (the tool task decodes up to 96 tokens)


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    """Every test keeps its sweep scores in its own folder."""
    monkeypatch.setenv("RAM_STUDIO_SWEEP_CACHE", str(tmp_path / "store"))


# ---------------------------------------------------------------- grids

def test_try_grid_expands_first_parameter_fastest():
    g = parse_try("ties lambda=0.5,1 density=0.1,0.2")
    cands = g.expand()
    assert [c.settings for c in cands] == ["lambda=0.5 density=0.1", "lambda=1.0 density=0.1",
                                           "lambda=0.5 density=0.2", "lambda=1.0 density=0.2"]
    assert cands[0].param_dict == {"density": 0.1, "lambda": 0.5}  # every parameter resolved, declaration order
    assert cands[0].label == "ties lambda=0.5 density=0.1"
    assert parse_try("average").expand()[0].label == "average"


@pytest.mark.parametrize("text, message", [
    ("ties lambda=-1", "invalid lambda=-1"),
    ("ties density=0", "must be in (0, 1]"),
    ("dare_ta drop_rate=1", "must be in [0, 1)"),
    ("ram_plus r=abc", "is not a valid float"),
    ("ties lambda=", "empty grid"),
    ("", "empty grid"),
    ("ties alpha=2", "has no parameter 'alpha'"),
    ("nosuch lambda=1", "unknown merge method"),
    ("ties lambda=1 lambda=2", "gives lambda twice"),
    ("ram_plus r=1e38 alpha=1e38", "overflows float32"),
    ("dare_ta lambda=@dare_ta", "refers to itself"),
    ("dare_ta lambda=@ram", "ram has no parameter lambda"),
    ("dare_ta lambda=@ties,0.5", "must be the only value"),
])
def test_bad_grids_are_one_clear_error(text, message):
    with pytest.raises(RamStudioError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        parse_try(text)


def test_references_order_the_stages_and_must_resolve():
    ta, dare = parse_try("task_arithmetic lambda=0.5,1"), parse_try("dare_ta lambda=@task_arithmetic drop_rate=0.1")
    assert dare.refs == {"lambda": "task_arithmetic"} and dare.axes[0][1] == (Ref("task_arithmetic"),)
    assert stages([dare, ta]) == [[ta], [dare]]
    with pytest.raises(RamStudioError, match="no task_arithmetic grid"):
        stages([dare])
    with pytest.raises(RamStudioError, match="cycle"):
        stages([parse_try("dare_ta lambda=@dare_ties"), parse_try("dare_ties lambda=@dare_ta")])
    with pytest.raises(RamStudioError, match="empty grid"):
        stages([])
    chosen = Candidate("task_arithmetic", (("lambda", 0.5),), ("lambda",))
    assert dare.expand({"task_arithmetic": chosen})[0].param_dict["lambda"] == 0.5


def test_yaml_grids_and_their_limits(tmp_path):
    grids = grids_from_yaml("grids:\n  - method: ties\n    lambda: [0.5, 1]\n    density: 0.2\n"
                            "  - 'ram_plus r=0,0.1'\n  - method: dare_ta\n    lambda: '@ties'\n    drop_rate: 1e-1\n")
    assert [g.text for g in grids] == ["ties lambda=0.5,1.0 density=0.2", "ram_plus r=0.0,0.1",
                                       "dare_ta lambda=@ties drop_rate=0.1"]
    for text, message in [("grids: []", "empty grid"), ("grids:\n  - {method: ties, lambda: [[1]]}", "list of values"),
                          ("a: &x [1]\ngrids: *x", "anchors, aliases or tags"), ("grids: [", "not valid YAML"),
                          ("grids:\n  - {method: ties, lambda: 5e40}", "overflows float32"),
                          ("other: 1\ngrids: ['average']", "unknown field"),
                          ("grids:\n  - {method: ties, lambda: !!python/object:os.system x}",
                           "anchors, aliases or tags"),
                          ("grids:\n  - {lambda: [1]}", "not a mapping with a method")]:
        with pytest.raises(RamStudioError, match=message):
            grids_from_yaml(text)
    many = "grids:\n  - method: ties\n    lambda: [" + ",".join(str(i) for i in range(200)) + "]\n" \
        "    density: [" + ",".join(f"{(i + 1) / 100}" for i in range(60)) + "]\n"
    with pytest.raises(RamStudioError, match="more than 10,000"):
        grids_from_yaml(many)


# ---------------------------------------------------------------- the protocol

class WeightProbe:
    """An evaluator whose scores are a fixed function of the weights in memory (a real model, loaded by the demo
    evaluator), reversed on the test split: were a test score ever used to choose, the choice would change.
    It records every call, in order."""

    name = "probe"
    tasks = ("probe",)

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def splits(self) -> tuple[str, ...]:
        return ("validation", "test")

    def fingerprint(self) -> str:
        return "weight-probe-1"

    def load(self, folder: Path):
        from transformers import AutoModelForCausalLM

        from evaluation.base import LoadedModel

        module = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, use_safetensors=True,
                                                      trust_remote_code=False)
        return LoadedModel(module=module.eval(), tokenizer=None, source=Path(folder))

    def score(self, model, split: str, *, limit=None, progress=None, cancel=None) -> Scores:
        total = sum(float(p.detach().double().sum()) for p in model.module.parameters())
        value = (abs(total) * 1e4) % 100.0
        self.calls.append((split, total))
        return Scores(split, {"probe": value if split == "validation" else 100.0 - value}, {"probe": 1})


GRIDS = ["task_arithmetic lambda=0.1,0.4,0.7,1.0", "ties lambda=0.5,1.0 density=0.1,0.3",
         "dare_ta lambda=@task_arithmetic drop_rate=0.2,0.6", "ram_plus r=0,0.1,0.2"]


def probe_sweep(store: ScoreStore, **kw):
    probe = WeightProbe()
    spec = SweepSpec(DEMO[0], DEMO[1:], [parse_try(t) for t in GRIDS], probe, **kw)
    return run_sweep(spec, LocalExecutor(), store=store), probe


def test_selection_reads_validation_only(tmp_path):
    res, probe = probe_sweep(ScoreStore(tmp_path / "s1"))
    valid = res.candidates("validation")
    assert len(valid) == 4 + 4 + 2 + 3
    for method in ("task_arithmetic", "ties", "dare_ta", "ram_plus"):
        mine = [e for e in valid if e.method == method]
        top = max(e.average for e in mine)
        assert res.selected[method] == next(e.candidate for e in mine if e.average == top)
    # dare_ta searched its drop rate at the λ chosen for task_arithmetic
    ta_lambda = res.selected["task_arithmetic"].param_dict["lambda"]
    assert {e.params["lambda"] for e in valid if e.method == "dare_ta"} == {ta_lambda}
    chosen = [res.selected[m] for m in res.selected]
    assert res.best == max(chosen, key=lambda c: next(e.average for e in valid if e.candidate == c))
    # every validation scoring came before the first test scoring, and only the chosen (and the 4 inputs) saw test
    splits = [s for s, _ in probe.calls]
    assert splits == ["validation"] * len(valid) + ["test"] * (len(chosen) + 4)
    assert {e.candidate for e in res.candidates("test")} == set(chosen)
    assert all(e.selected for e in res.candidates("test")) and sum(e.best for e in res.candidates("test")) == 1


def test_stored_test_scores_never_decide(tmp_path):
    """Test scores of every candidate already in the store (e.g. from another sweep) change no choice."""
    honest, _ = probe_sweep(ScoreStore(tmp_path / "s1"))
    store = ScoreStore(tmp_path / "s2")
    first, _ = probe_sweep(store)
    for f in store.folder.glob("*.json"):  # poison: every stored validation score also appears as a test score,
        doc = json.loads(f.read_text())   # the worst candidate's test score at 1000
        if doc["key"]["split"] == "validation" and "method" in doc["key"]:
            key = {**doc["key"], "split": "test"}
            store.put(key, {**doc["result"], "average": 1000.0 - doc["result"]["average"], "scores": {"probe": 0.0}})
    again, probe = probe_sweep(store)
    assert again.selected == honest.selected == first.selected and again.best == honest.best
    assert [s for s, _ in probe.calls] == []  # everything came from the store, nothing was scored again
    assert all(e.resumed for e in again.entries)


def test_select_refuses_another_split():
    e = Entry("candidate", "x", "test", "ties", average=50.0)
    with pytest.raises(AssertionError):
        select("ties", [e], "validation")


def test_protocol_refuses_selecting_on_test():
    for argv, message in [(["--select-on", "test"], "choose settings on the test split"),
                          (["--select-on", "train"], "does not exist"),
                          (["--select-on", "validation", "--report-on", "validation"], "same split")]:
        code, err = run_cli(*DEMO, "--try", "average", *argv)
        assert code == 2 and message in err


# ---------------------------------------------------------------- CLI, outputs, resume

def run_cli(*argv: str, cwd: Path | None = None) -> tuple[int, str]:
    """`ram-studio sweep ARGV` in this process (as the entry point runs it): exit code and stderr."""
    import contextlib
    import io

    err = io.StringIO()
    here = os.getcwd()
    try:
        os.chdir(cwd or here)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["sweep", *argv])
    finally:
        os.chdir(here)
    return code, err.getvalue()


def test_too_few_agents_is_one_line(tmp_path):
    code, err = run_cli("demo:base", "demo:code", "--try", "ties density=0.2", "--json", str(tmp_path / "o.json"))
    assert code == 2 and "ties merges at least 2 agents; the sweep has 1" in err and not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["--try", "ties lambda=2,-0.5"], "invalid lambda=-0.5"),
    (["--try", "ties lambda="], "empty grid"),
    ([], "empty grid"),
    (["--try", "average", "--tasks", "nosuch"], "unknown demo task"),
    (["--try", "average", "--limit", "0"], "--limit must be a positive"),
    (["--try", "average", "--keep", "some"], "unknown --keep"),
    (["--grids", "missing.yaml"], "does not exist"),
    (["--try", "average", "--include-path", "x"], "it goes with --lm-eval"),
    (["--try", "ties density=0.2", "--try", "ram r=0.1"], "ram has no parameter 'r'"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, argv, message):
    keep = [] if "--keep" in argv else ["--keep", "best"]
    code, err = run_cli(*DEMO, *argv, *keep, "--json", str(tmp_path / "out.json"), "--csv", str(tmp_path / "out.csv"),
                        "--out", str(tmp_path / "kept"), cwd=tmp_path)
    assert code == 2, err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a refused sweep wrote something"


def test_outputs_follow_the_interface(tmp_path):
    odd = shutil.copytree(REPO / "assets/demo/models/code", tmp_path / "=HYPERLINK(evil)")
    out = tmp_path / "res"
    out.mkdir()
    code, err = run_cli("demo:base", str(odd), "demo:tool", "--try", "task_arithmetic lambda=0.5,1.0",
                        "--try", "ram_plus r=0.1", "--limit", str(LIMIT), *FAST, "--json", str(out / "s.json"),
                        "--csv", str(out / "s.csv"), "--quiet")
    assert code == 0, err
    doc = json.loads((out / "s.json").read_text())
    assert len(doc["candidates"]) == 3 + 2  # 3 on validation, the 2 chosen on test
    for c in doc["candidates"]:
        assert {"method", "params", "split", "scores", "average", "merge_s", "eval_s", "selected"} <= set(c)
        assert set(c["scores"]) == {"code", "memory"} and all(0 <= v <= 100 for v in c["scores"].values())
        assert c["average"] == pytest.approx(sum(c["scores"].values()) / 2)
    assert [c["split"] for c in doc["candidates"]] == ["validation"] * 3 + ["test"] * 2
    assert {c["candidate"] for c in doc["candidates"] if c["split"] == "test"} == set(doc["selected"].values())
    assert [r["model"] for r in doc["references"]] == ["base", "=HYPERLINK(evil)", "tool"]
    table = pd.read_csv(out / "s.csv")
    assert len(table) == 5 + 3 and "'=HYPERLINK(evil)" in set(table["candidate"])  # escaped, not a formula
    assert sorted(p.name for p in out.iterdir()) == ["s.csv", "s.json"]  # --keep none: no model folder


def test_keep_best_writes_only_the_best_through_the_merge_path(tmp_path):
    res_dir = tmp_path / "kept"
    code, err = run_cli(*DEMO, "--try", "task_arithmetic lambda=0.5,1.0", "--limit", str(LIMIT), *FAST, "--keep",
                        "best",
                        "--out", str(res_dir), "--json", str(tmp_path / "s.json"), "--quiet")
    assert code == 0, err
    doc = json.loads((tmp_path / "s.json").read_text())
    (folder,) = [Path(p) for p in doc["kept"]]
    assert folder.parent == res_dir and sorted(p.name for p in res_dir.iterdir()) == [folder.name]
    recipe = json.loads((folder / "ram_recipe.json").read_text())
    assert f"task_arithmetic {' '.join(f'{k}={v}' for k, v in recipe['spec']['params'].items())}" == doc["best"]
    assert recipe["sweep"]["candidate"] == doc["best"]
    assert main(["merge", *DEMO, "--method", "task_arithmetic", "--lambda", str(recipe["spec"]["params"]["lambda"]),
                 "--out", str(tmp_path / "cli"), "--quiet"]) == 0
    assert (folder / "model.safetensors").read_bytes() == (tmp_path / "cli" / "model.safetensors").read_bytes()


def test_resume_after_an_interrupt_in_process(tmp_path):
    grids = [parse_try("task_arithmetic lambda=0.3,0.6,1.0"), parse_try("ram_plus r=0.1")]
    store = ScoreStore(tmp_path / "store")
    stop = threading.Event()

    def progress(p):
        if p.done >= 2:
            stop.set()

    spec = SweepSpec(DEMO[0], DEMO[1:], grids, DemoEvaluator(["code", "memory"]), limit=LIMIT)
    with pytest.raises(Cancelled):
        run_sweep(spec, LocalExecutor(), store=store, progress=progress, cancel=stop)
    kept = len(list(store.folder.glob("*.json")))
    assert 2 <= kept < 4 + 2 + 4
    resumed = run_sweep(spec, LocalExecutor(), store=store)
    assert sum(e.resumed for e in resumed.entries) == kept
    fresh = run_sweep(spec, LocalExecutor(), store=ScoreStore(tmp_path / "other"))
    view = [(e.label, e.split, e.scores, e.detail, e.selected, e.best) for e in resumed.entries]
    assert view == [(e.label, e.split, e.scores, e.detail, e.selected, e.best) for e in fresh.entries]
    # a different evaluator setting is a different key: nothing is reused
    other = SweepSpec(DEMO[0], DEMO[1:], grids[1:], DemoEvaluator(["code", "memory"]), limit=LIMIT + 1,
                      references=False)
    assert not any(e.resumed for e in run_sweep(other, LocalExecutor(), store=store).entries)


def test_ctrl_c_keeps_the_scores_and_the_next_run_resumes(tmp_path):
    store = tmp_path / "store"
    argv = [sys.executable, "-m", "ram_studio", "sweep", *DEMO, "--try",
            "task_arithmetic lambda=0.1,0.3,0.5,0.7,0.9,1.0",
            "--limit", str(LIMIT), *FAST, "--json", str(tmp_path / "s.json")]
    env = {**os.environ, "RAM_STUDIO_SWEEP_CACHE": str(store)}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while len(list(store.glob("*.json"))) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: sweep interrupted:") and "Run the same command again to resume" in last
    assert "Traceback" not in err and not (tmp_path / "s.json").exists()
    kept = len(list(store.glob("*.json")))
    assert kept >= 2
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "s.json").read_text())
    assert sum(c["resumed"] for c in doc["candidates"]) + sum(r["resumed"] for r in doc["references"]) == kept


def test_a_failing_candidate_is_reported_not_fatal(tmp_path):
    from tests.factory import make_agent, make_base

    base = make_base(tmp_path / "base", shard=None)
    agents = [make_agent(base, tmp_path / f"a{i}", 0.3, seed=i, scale=10.0) for i in range(2)]

    class Constant(WeightProbe):
        def score(self, model, split, **kw):
            return Scores(split, {"probe": 50.0}, {"probe": 1})

    spec = SweepSpec(str(base), [str(a) for a in agents], [parse_try("task_arithmetic lambda=1,3e38")], Constant())
    res = run_sweep(spec, LocalExecutor(), store=ScoreStore(tmp_path / "store"))
    bad = [e for e in res.entries if e.error]
    assert len(bad) == 1 and "not finite" in bad[0].error and bad[0].params["lambda"] == 3e38
    assert res.selected["task_arithmetic"].param_dict["lambda"] == 1.0
    assert torch.isnan(torch.tensor(bad[0].average))


def test_references_shaped_unlike_the_base_are_scored_on_their_own(tmp_path):
    """--on-mismatch base lets in an agent with a larger vocabulary: candidates merge as a merge would, and the
    agent's own reference row loads it as it is."""
    from tests.factory import make_agent, make_base

    base = make_base(tmp_path / "base", shard=None)
    small = make_agent(base, tmp_path / "small", 0.3, seed=1)
    big = make_base(tmp_path / "big", shard=None, seed=2, vocab=97)
    spec = SweepSpec(str(base), [str(small), str(big)], [parse_try("task_arithmetic lambda=0.5,1")], WeightProbe(),
                     on_mismatch="base")
    res = run_sweep(spec, LocalExecutor(), store=ScoreStore(tmp_path / "store"))
    refs = {e.label: e for e in res.references()}
    assert set(refs) == {"base", "small", "big"} and all(e.ok for e in refs.values())
    assert len({e.average for e in refs.values()}) == 3  # three different models were scored


def test_measure_returns_the_candidates_in_the_order_asked(tmp_path):
    from evaluation.grid import candidate
    from evaluation.sweep import measure

    a, b = candidate("ram_plus", {"r": 0.1}), candidate("ram_plus", {"r": 0.3})
    spec = SweepSpec(DEMO[0], DEMO[1:], [], WeightProbe())
    store = ScoreStore(tmp_path / "store")
    measure(spec, [b], "validation", LocalExecutor(), store=store)  # b is stored, a is not
    got = measure(spec, [a, b], "validation", LocalExecutor(), store=store)
    assert [e.candidate for e in got] == [a, b] and [e.resumed for e in got] == [False, True]
    assert got[0].label == "ram_plus r=0.1" and got[0].params["alpha"] == 2.0


def test_a_sweep_on_lm_eval_tasks(tmp_path):
    """--lm-eval: the harness scores every candidate in memory; validation (the TASK_validation companion) and test
    report under the same task name, so each task is one column of the table."""
    code, err = run_cli(*DEMO, "--try", "task_arithmetic lambda=0.5,1.0", "--lm-eval", "ram_demo_code",
                        "--include-path", str(REPO / "assets/demo/lm_eval_tasks"), "--limit", "8",
                        "--json", str(tmp_path / "s.json"), "--csv", str(tmp_path / "s.csv"))
    assert code == 0, err
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["sweep"]["evaluator"] == "lm-eval"
    assert {tuple(c["scores"]) for c in doc["candidates"]} == {("ram_demo_code",)}
    assert [c["split"] for c in doc["candidates"]] == ["validation", "validation", "test"]
    assert list(pd.read_csv(tmp_path / "s.csv").columns).count("ram_demo_code") == 1

"""The shared-skill demo trio (`demo-shared:`): references, the suite a model folder names, and the
`--suite shared` quick build (the committed trio's targets are in tests/demo/test_shared_checkpoints.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from merging.common.errors import RamStudioError
from merging.reading.refs import (
    DEMO_SHARED_PREFIX,
    demo_folder,
    demo_names,
    demo_root,
    parse_ref,
    resolve,
)
from tests.cli_helpers import run
from tests.paths import REPO_ROOT

REPO = REPO_ROOT
AGENTS = ("code", "tool", "memory")


@pytest.fixture(scope="module")
def shared_quick(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A quick build of the shared-skill trio (tiny sizes, a few RL steps)."""
    out = tmp_path_factory.mktemp("demo-shared-quick")
    proc = subprocess.run([sys.executable, "-m", "demo.build", "--suite", "shared", "--quick",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_demo_shared_refs_name_the_shared_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ref = parse_ref("demo-shared:code")
    assert ref.kind == "demo" and ref.label == "code"
    assert ref.path == REPO / "assets" / "demo" / "models-shared" / "code"
    assert parse_ref("demo:code").path == REPO / "assets" / "demo" / "models" / "code"
    assert demo_folder("demo-shared:tool") == str(demo_root(DEMO_SHARED_PREFIX) / "tool")
    assert demo_folder("org/name") == "org/name"
    monkeypatch.setenv("RAM_STUDIO_DEMO_SHARED_ROOT", str(tmp_path))
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    assert demo_names(DEMO_SHARED_PREFIX) == ["base"]
    assert resolve("demo-shared:base") == tmp_path / "base"
    with pytest.raises(RamStudioError) as err:
        resolve("demo-shared:nope")
    assert "demo-shared:base" in err.value.hint and "demo:" not in err.value.hint.replace("demo-shared:", "")
    monkeypatch.setenv("RAM_STUDIO_DEMO_SHARED_ROOT", str(tmp_path / "absent"))
    with pytest.raises(RamStudioError) as err:
        resolve("demo-shared:base")
    assert "--suite shared" in err.value.hint


def test_library_never_imports_the_demo() -> None:
    """refs only map names to folders: importing the library's refs and CLI loads nothing of the demo's code."""
    code = ("import sys, merging.reading.refs, merging.interop.mergekit, ram_studio.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('demo', 'assets')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_quick_shared_build(shared_quick: Path) -> None:
    """The shared quick build writes models-shared/ and results-shared/, names its suite in every config
    (so its merges carry it too), and its RL agents took real steps on the enveloped tasks."""
    import pandas as pd
    from safetensors.torch import load_file

    models, results = shared_quick / "models-shared", shared_quick / "results-shared"
    assert not (shared_quick / "models").exists() and not (shared_quick / "results").exists()
    for name in ("base", *AGENTS):
        config = json.loads((models / name / "config.json").read_text())
        assert config["ram_studio_demo_suite"] == "shared", name
    acc = pd.read_csv(results / "accuracy.csv")
    assert "format_slip" in acc.columns and set(acc.model) == {"base", *AGENTS}
    log = pd.read_csv(results / "training_log.csv")
    rl = log[log.stage == "rl"]
    assert (rl.frac_groups_with_signal > 0).all() and set(rl.agent) == set(AGENTS)
    base = load_file(str(models / "base" / "model.safetensors"))
    for agent in AGENTS:
        tuned = load_file(str(models / agent / "model.safetensors"))
        assert any(not tuned[k].equal(base[k]) for k in base), agent
    info = json.loads((results / "build_info.json").read_text())
    assert info["config"]["suite"] == "shared" and info["config"]["warmup"]["format_slip_rate"] > 0


def test_evaluate_picks_the_suite_from_the_model(shared_quick: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """`ram-studio evaluate` scores a demo-shared model (or any folder whose config names the suite) on the
    shared suite, `--suite` overrides it, and an unknown suite name is one clear line with exit 2."""
    env_root = shared_quick / "models-shared"
    monkeypatch.setenv("RAM_STUDIO_DEMO_SHARED_ROOT", str(env_root))

    def evaluate(*args: str) -> dict:
        out = tmp_path / f"eval-{len(list(tmp_path.iterdir()))}.json"
        code, _, err = run(capsys, "evaluate", *args, "--tasks", "code", "--limit", "4", "--json", out)
        assert code == 0, err
        return json.loads(out.read_text())

    assert evaluate("demo-shared:code")["suite"] == "shared"
    assert evaluate(str(env_root / "code"))["suite"] == "shared"
    assert evaluate("demo-shared:code", "--suite", "demo")["suite"] == "demo"
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in (env_root / "code").iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "ram_studio_demo_suite": "\x1b[31mevil"}))
    code, _, err = run(capsys, "evaluate", bad, "--limit", "2")  # one line, never a traceback (run checks it)
    assert code == 2 and "unknown task suite" in err and "\x1b" not in err

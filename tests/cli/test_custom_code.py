"""A model folder's own Python never runs and is never asked about: a folder whose config.json names a
`model_type` transformers does not know, with an `auto_map` pointing at the folder's own `configuration_*.py`
and `modeling_*.py` (code that would leave a marker file behind), gets one clear line and exit 2 from
`evaluate` (demo tasks and --lm-eval) and `sweep`, even with "y" waiting on stdin — and every
`from_pretrained` call in the tree passes `trust_remote_code=False`."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factory import checksums

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "assets" / "demo" / "models"
TASKS_DIR = ROOT / "assets" / "demo" / "lm_eval_tasks"

# Python that leaves a marker next to itself when imported: proof that a folder's code ran.
TRAP = ("import pathlib\n"
        "pathlib.Path(__file__).with_name('CODE_RAN').write_text('the folder\\'s own Python ran')\n"
        "from transformers import PretrainedConfig, PreTrainedModel\n"
        "class TrapConfig(PretrainedConfig):\n    model_type = 'ram_studio_trap'\n"
        "class TrapModel(PreTrainedModel):\n    config_class = TrapConfig\n")


def custom_code_folder(root: Path, *, tokenizer_only: bool = False, model: str = "base") -> Path:
    """A copy of a demo model whose config (or only its tokenizer config) asks for the folder's own code."""
    folder = shutil.copytree(DEMO / model, root / f"custom-code-{model}")
    for name in ("configuration_trap.py", "modeling_trap.py", "tokenization_trap.py"):
        (folder / name).write_text(TRAP)
    if tokenizer_only:
        tok = json.loads((folder / "tokenizer_config.json").read_text())
        tok.update(tokenizer_class="TrapTokenizer",
                   auto_map={"AutoTokenizer": ["tokenization_trap.TrapTokenizer", None]})
        (folder / "tokenizer_config.json").write_text(json.dumps(tok))
        return folder
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="ram_studio_trap", architectures=["TrapModel"],
               auto_map={"AutoConfig": "configuration_trap.TrapConfig",
                         "AutoModelForCausalLM": "modeling_trap.TrapModel"})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def cli(args: list, tmp_path: Path, stdin: str = "y\ny\ny\n") -> subprocess.CompletedProcess:
    """The CLI as a user runs it, "y" answered to any question transformers might ask."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "HF_MODULES_CACHE": str(tmp_path / "hf-modules")}
    return subprocess.run([sys.executable, "-m", "ram_studio", *map(str, args)], cwd=ROOT, env=env, input=stdin,
                          capture_output=True, text=True, timeout=600)


def refused_without_running(proc: subprocess.CompletedProcess, folder: Path, tmp_path: Path) -> None:
    """Exit 2, one line naming the folder's own code, no question asked, no code run or copied anywhere."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "own Python" in lines[0] and "never" in lines[0], lines[0]
    assert "[y/N]" not in proc.stdout + proc.stderr
    assert not (folder / "CODE_RAN").exists()
    assert not list((tmp_path / "hf-modules").rglob("*trap*"))  # not even copied into transformers' module cache


@pytest.mark.parametrize("how", ["demo-tasks", "lm-eval", "tokenizer-only"])
def test_evaluate_never_runs_or_asks_about_a_folders_code(tmp_path, how):
    folder = custom_code_folder(tmp_path, tokenizer_only=how == "tokenizer-only")
    before = checksums([folder])
    extra = ["--lm-eval", "ram_demo_code", "--include-path", TASKS_DIR] if how == "lm-eval" else []
    proc = cli(["evaluate", folder, "--limit", "1", *extra], tmp_path)
    refused_without_running(proc, folder, tmp_path)
    assert checksums([folder]) == before


def test_sweep_never_runs_a_folders_code(tmp_path):
    folder, *agents = (custom_code_folder(tmp_path, model=m) for m in ("base", "code", "tool"))
    proc = cli(["sweep", folder, *agents, "--try", "task_arithmetic lambda=0.5", "--tasks", "code",
                "--limit", "1", "--quiet"], tmp_path)
    refused_without_running(proc, folder, tmp_path)


def test_the_loaders_refuse_in_process_with_one_error(tmp_path):
    """The API (and the app, which calls it) gets one RamStudioError, not a question on stdin."""
    from merging.common.errors import RamStudioError
    from merging.reading.transformers_load import load_causal_lm, load_tokenizer

    folder = custom_code_folder(tmp_path)
    for load in (load_causal_lm, load_tokenizer):
        with pytest.raises(RamStudioError, match="own Python"):
            load(folder)
    assert not (folder / "CODE_RAN").exists()


def test_a_known_architecture_with_an_auto_map_loads_the_built_in_class(tmp_path):
    """A real Hub pattern (e.g. an architecture that later joined transformers): model_type known, auto_map still
    there. transformers' own class is used; the folder's code is not imported."""
    from merging.reading.transformers_load import load_causal_lm

    folder = shutil.copytree(DEMO / "base", tmp_path / "known")
    (folder / "modeling_trap.py").write_text(TRAP)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_trap.TrapModel"}
    (folder / "config.json").write_text(json.dumps(cfg))
    model = load_causal_lm(folder)
    assert type(model).__name__ == "Qwen2ForCausalLM" and not (folder / "CODE_RAN").exists()


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Call):  # a factory's result called: `_progress_hflm()(pretrained=…)`
                yield f"{getattr(func.func, 'id', None)}()", node
                continue
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            yield name, node


def _passes_false(call: ast.Call) -> bool:
    return any(k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is False
               for k in call.keywords)


def test_every_from_pretrained_in_the_tree_passes_trust_remote_code_false():
    """Every `from_pretrained(...)` and every lm-eval model built (HFLM, VLLM) in the repository's Python — code,
    tests and benchmarks — passes trust_remote_code=False literally; in the library, only the one loader module
    calls transformers' loaders at all."""
    offenders, loaders = [], set()
    files = [p for p in ROOT.rglob("*.py") if not {".venv", "node_modules", ".git"} & set(p.parts)]
    assert len(files) > 100
    for path in files:
        rel = path.relative_to(ROOT)
        for name, call in _calls(ast.parse(path.read_text(), str(rel))):
            if name in ("from_pretrained", "HFLM", "VLLM", "_progress_hflm()") and not _passes_false(call):
                offenders.append(f"{rel}:{call.lineno} {name}")
            if name == "from_pretrained" and rel.parts[0] not in ("tests",):
                loaders.add(str(rel))
    assert not offenders, offenders
    assert loaders == {"merging/reading/transformers_load.py"}, loaders

"""The layers point down and no module imports itself back: app, ram_studio → demo → evaluation → analysis → merging.
Also: merging's stages point down, sizes stay readable, a method is one file, a demo task is one declaration,
assets/ holds data and no code, the analysis never merges, no module imports another's private name or calls the
interpreter's, importing the packages changes no environment variable, every path a comment names exists, a widget
key is written once, and no issue number appears anywhere in the tree.

Every import is counted, including those inside functions. Two documented exceptions: `merging/__main__.py`,
the `python -m merging` alias of the CLI, is an entry point that nothing imports; and `ram_studio` (the CLI and
the Python API) may import the app's figure builders, `app.charts` (pure: frames in, plotly figures out), so the
API returns the same figures the pages draw — nothing else of the app.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.source_text import comments_and_docstrings

ROOT = Path(__file__).resolve().parent.parent
# Higher rank = higher layer; a module may import its own package or lower ranks only.
RANK = {"merging": 0, "analysis": 1, "evaluation": 2, "demo": 3, "ram_studio": 4, "app": 4}
ENTRY_POINTS = {"merging.__main__"}
SHARED_SIDEWAYS = {"ram_studio": "app.charts"}  # a top package → the one part of the other top package it may use


def modules() -> dict[str, Path]:
    found = {}
    for pkg in RANK:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = f
    return found


def import_edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module → the project modules it imports (anywhere in the file)."""
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in mods else prefix for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        edges[name] = deps
    return edges


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, deps in edges.items():
        if src in ENTRY_POINTS:
            continue
        top = src.split(".")[0]
        for dst in deps:
            other = dst.split(".")[0]
            shared = SHARED_SIDEWAYS.get(top)
            if shared and (dst == shared or dst.startswith(shared + ".")):
                continue
            if other != top and RANK[other] >= RANK[top]:
                bad.append(f"{src} imports {dst}")
    return sorted(bad)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(edges.get(u, ())):
            if state.get(v) == 1:
                found.append(stack[stack.index(v):] + [v])
            elif not state.get(v):
                visit(v)
        stack.pop()
        state[u] = 2

    for u in sorted(edges):
        if not state.get(u):
            visit(u)
    return found


# Inside merging/, the stages of a merge, top to bottom: the orchestrator, interop, the engine, the single
# passes and the writers, the recipe, reading, the methods (with the region rule), the kernels; `common` (errors,
# escaping, bounded parsers, dtypes, units, the device) and the package root sit under everything.
STAGE = {"merging.merge": 8, "merging.interop": 7, "merging.engine": 6, "merging.passes": 5, "merging.writing": 5,
         "merging.recipe": 4, "merging.presets": 4, "merging.reading": 3, "merging.methods": 2, "merging.kernels": 1,
         "merging.common": 0,
         "merging": 0}
FILE_LINES = 400  # "no file over ~400 lines"
FUNCTION_LINES = 60  # "no function over ~60 lines outside the kernels"


def stage(module: str) -> int | None:
    """The stage of a merging module: its longest prefix in STAGE."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in STAGE:
            return STAGE[".".join(parts[:i])]
    return None


def upward_stage_imports(edges: dict[str, set[str]]) -> list[str]:
    """merging modules importing a module of a higher stage, or of another sub-package at their own stage."""
    bad = []
    for src, deps in edges.items():
        if not src.startswith("merging") or src in ENTRY_POINTS:
            continue
        for dst in deps:
            if not dst.startswith("merging") or dst == "merging":
                continue
            s, d = stage(src), stage(dst)
            same_package = src.split(".")[:2] == dst.split(".")[:2]
            if d > s or (d == s and not same_package and s > 0):
                bad.append(f"{src} imports {dst}")
    return sorted(bad)


def oversized(root: Path = ROOT) -> list[str]:
    """Files over FILE_LINES lines and functions over FUNCTION_LINES lines (numba kernels excepted)."""
    found = []
    for _name, path in sorted(modules().items()):
        text = path.read_text()
        if text.count("\n") > FILE_LINES:
            found.append(f"{path.relative_to(root)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                kernel = any("njit" in ast.unparse(d) for d in node.decorator_list)
                if size > FUNCTION_LINES and not kernel:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {size} lines")
    return found


def test_merging_stages_point_down():
    assert upward_stage_imports(import_edges(modules())) == []


def test_no_file_or_function_is_too_long():
    assert oversized() == []


def test_lower_packages_never_import_higher_ones():
    assert upward_imports(import_edges(modules())) == []


def test_no_import_cycles_between_modules():
    assert cycles(import_edges(modules())) == []


def test_the_checks_can_fail():
    """The two checks above see a violation when there is one (they are not vacuous)."""
    edges = {"merging.merge": {"analysis.stats"}, "analysis.stats": {"merging.engine.loop"},
             "merging.engine.loop": {"merging.merge"}, "app.state": {"ram_studio.cli"},
             "ram_studio.cli": {"app.charts.base", "app.jobs"}}
    assert upward_imports(edges) == ["app.state imports ram_studio.cli", "merging.merge imports analysis.stats",
                                     "ram_studio.cli imports app.jobs"]
    assert cycles(edges) == [["analysis.stats", "merging.engine.loop", "merging.merge", "analysis.stats"]]
    assert upward_imports({"evaluation.sweep": {"demo.tasks"}, "demo.table1": {"evaluation.sweep"}}) == \
        ["evaluation.sweep imports demo.tasks"]  # the demo is a layer above the library
    real = import_edges(modules())
    assert "merging.merge" in real and "merging.engine.counts" in real["merging.merge"]  # the parser sees imports
    assert "evaluation.sweep" in real["demo.table1"]


# ---------------------------------------------------------------- a method is one file

HALF_SUM = '''"""half_sum: θ0 + f·Σ_t τ_t with f = 0.5 by default — a method added by the architecture test."""
from __future__ import annotations

import numpy as np
import torch

from merging.methods.base import ChunkContext, MergeMethod
from merging.methods.params import Param
from merging.methods.regions import f32
from merging.methods.registry import register

FUSED_CALLS = [0]  # how often the kernel path ran (the test reads it)


def half_sum(taus: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
    return taus.sum(0) * f32(ctx.params["half_factor"])


def _fused(base, agents, ctx: ChunkContext, out, peak) -> None:
    from merging.kernels.linear import linear

    FUSED_CALLS[0] += 1
    linear(base, agents, np.float32(ctx.params["half_factor"]), out, peak)


FACTOR = Param("half_factor", float, 0.5, "Scale f of the summed task vectors.", low=0.0, float32=True,
               label="f (scale of the sum)")
register(MergeMethod("half_sum", "Half sum: θ0 + f·Σ_t τ_t (f = 0.5).", half_sum, (FACTOR,), fused=_fused,
                     kernels=("linear",)))
'''

# Runs inside the copy: the CLI, with the kernels made ready first unless RAM_STUDIO_KERNELS=torch; prints
# the exit code and how often half_sum's kernel ran.
CLI_DRIVER = '''import json, sys
import merging.kernels as kernels
from merging.passes import GUARD_KERNELS
if kernels.kernels_enabled():
    assert kernels.wait_ready(("linear",) + GUARD_KERNELS, ("bf16",), timeout=900)
import merging.methods.half_sum as half_sum
from ram_studio.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "fused_calls": half_sum.FUSED_CALLS[0]}))
'''

# Runs inside the copy: the app's Merge page, with half_sum chosen; the recipe reader; the mergekit export.
APP_DRIVER = '''import faulthandler, json, sys
faulthandler.dump_traceback_later(150, exit=True)  # a hang fails the test with every thread's traceback
from pathlib import Path
from streamlit.testing.v1 import AppTest
from merging.interop.mergekit import to_mergekit_yaml
from merging.recipe import read_recipe
at = AppTest.from_file(str(Path.cwd() / "app" / "main.py"), default_timeout=120)
at.switch_page("views/merge.py").run()
options = list(at.selectbox(key="merge_method").options)
at.selectbox(key="merge_method").set_value("half_sum").run()
spec, _ = read_recipe(Path(sys.argv[1]))
print(json.dumps({"exceptions": [str(e.value) for e in at.exception], "options": options,
                  "inputs": [w.label for w in at.number_input], "recipe": [spec.method, spec.params],
                  "mergekit": list(to_mergekit_yaml(spec, out_dtype="BF16"))}))
'''


def repository_copy(dst: Path) -> Path:
    """The packages and pyproject.toml copied to `dst` (timestamps kept, so numba's cache of the kernels,
    copied along, stays valid there)."""
    for pkg in (*RANK, "assets"):
        if (ROOT / pkg).is_dir() and not (dst / pkg).exists():
            shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("images", "*.ready"))
    shutil.copy2(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


def run_in(copy: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAM_STUDIO_KERNELS")}
    environ.update(PYTHONPATH=str(copy), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **env)
    done = subprocess.run([sys.executable, *args], cwd=copy, env=environ, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.timeout(1200)
def test_adding_a_method_is_one_file(family, tmp_path):
    """A new file in merging/methods/ — and nothing else — gives a method that the CLI lists with its flags,
    that merges on the kernel and the torch paths (same bytes, the expected values), whose recipe
    validates and re-runs, that the app's Merge form offers with its parameter, and that the mergekit
    export says has no equivalent."""
    from safetensors.torch import load_file

    copy = repository_copy(tmp_path / "repo")
    (copy / "merging" / "methods" / "half_sum.py").write_text(HALF_SUM)
    (tmp_path / "drive_cli.py").write_text(CLI_DRIVER)  # not app.py: the driver's folder comes first on sys.path
    (tmp_path / "drive_app.py").write_text(APP_DRIVER)
    base, agents = family
    inputs = [str(base), *map(str, agents)]

    listed = run_in(copy, ["-m", "ram_studio", "methods"]).stdout
    assert "half_sum" in listed and "half_factor=0.5" in listed
    helped = run_in(copy, ["-m", "ram_studio", "merge", "--help"]).stdout
    assert "half_sum" in helped and "--half-factor" in helped

    outputs, runs = {}, {}
    for path in ("numba", "torch"):
        out = tmp_path / path
        done = run_in(copy,
                      [str(tmp_path / "drive_cli.py"), "merge", *inputs, "--method", "half_sum", "--half-factor", "0.5",
                             "--out", str(out), "--quiet"], RAM_STUDIO_KERNELS=path)
        runs[path] = json.loads(done.stdout.strip().splitlines()[-1])
        outputs[path] = {f.name: f.read_bytes() for f in out.glob("*.safetensors")}
    assert runs["numba"]["code"] == runs["torch"]["code"] == 0
    assert runs["numba"]["fused_calls"] > 0 and runs["torch"]["fused_calls"] == 0  # the two paths really ran
    assert outputs["numba"] == outputs["torch"] and outputs["numba"]

    merged = {}
    for f in (tmp_path / "numba").glob("*.safetensors"):
        merged.update(load_file(f))
    theirs = [state_of(a) for a in agents]
    for name, b in state_of(base).items():
        total = torch.zeros(b.numel())
        for t in theirs:
            total += t[name].float().reshape(-1) - b.float().reshape(-1)  # Σ τ_t in agent order, from +0
        want = (b.float().reshape(-1) + total * np.float32(0.5)).to(b.dtype).view(b.shape)
        assert torch.equal(merged[name], want), name

    again = tmp_path / "again"
    run_in(copy, ["-m", "ram_studio", "run", str(tmp_path / "numba" / "ram_recipe.json"), "--out", str(again),
                  "--quiet"])
    assert {f.name: f.read_bytes() for f in again.glob("*.safetensors")} == outputs["numba"]
    assert not (tmp_path / "numba" / "mergekit.yaml").exists()
    assert "No mergekit config computes this merge" in (tmp_path / "numba" / "README.md").read_text()

    report = json.loads(run_in(copy, [str(tmp_path / "drive_app.py"), str(tmp_path / "numba" / "ram_recipe.json")],
                               RAM_STUDIO_CACHE=str(tmp_path / "cache"),
                               RAM_STUDIO_SWEEP_CACHE=str(tmp_path / "sweeps")).stdout.strip().splitlines()[-1])
    assert report["exceptions"] == []
    assert any(o.startswith("half_sum") for o in report["options"])
    assert "f (scale of the sum)" in report["inputs"]
    assert report["recipe"] == ["half_sum", {"half_factor": 0.5}]
    assert report["mergekit"] == [None, "mergekit has no equivalent of half_sum."]


def state_of(folder: Path) -> dict[str, torch.Tensor]:
    from tests.factory import state

    return state(folder)


# ---------------------------------------------------------------- names, references and numbers a reader relies on

TEST_ROOTS = (*RANK, "assets", "tests")  # every Python file the project owns (assets/: the lm-eval glue)
# Layers that must not use a part of a lower one: the analysis reads models and counts, it never merges (it writes
# its own files through merging.writing's checked outputs).
FORBIDDEN = {"analysis": ("merging.engine", "merging.merge")}


def project_files(roots: tuple[str, ...] = TEST_ROOTS) -> list[Path]:
    return sorted(f for pkg in roots if (ROOT / pkg).is_dir() for f in (ROOT / pkg).rglob("*.py"))


def private(name: str) -> bool:
    """`_helper` is private to its module; `__dunder__` and `_sunder_` names (protocols) are not."""
    return name.startswith("_") and not name.endswith("_")


def private_imports(source: str, where: str, project: set[str]) -> list[str]:
    """Private names of another project module that `source` imports (`from m import _x`, `import m._x`) or reads
    from an imported project module (`m._x`). Monkeypatching a module's private by name is not an import."""
    found, modules = [], set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            ours = node.level > 0 or module.split(".")[0] in project
            for alias in node.names:
                if ours and private(alias.name):
                    found.append(f"{where}:{node.lineno}: from {'.' * node.level}{module} import {alias.name}")
                elif ours:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in project:
                    continue
                if any(private(part) for part in alias.name.split(".")):
                    found.append(f"{where}:{node.lineno}: import {alias.name}")
                modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name) \
                and node.value.id in modules:
            found.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_name():
    """A leading underscore means "this module's own": what another module (or a test) needs is public. Tests are
    held to the same rule; they may replace a module's private by name (`monkeypatch.setattr(m, "_x", …)`)."""
    project = set(TEST_ROOTS)
    found = [hit for f in project_files() for hit in private_imports(f.read_text(), str(f.relative_to(ROOT)), project)]
    assert found == []


def test_the_private_import_check_can_fail():
    project = set(TEST_ROOTS)
    source = ("from app.charts.base import _layout, chart_layout\nfrom .base import _x\nimport merging.kernels as k\n"
              "import torch\nk._WARMUP.wait()\ntorch._C\nk.__name__\nk._repr_html_()\n"
              "from merging import _hidden as h\n")
    assert private_imports(source, "x.py", project) == [
        "x.py:1: from app.charts.base import _layout", "x.py:2: from .base import _x",
        "x.py:9: from merging import _hidden", "x.py:5: k._WARMUP"]


def forbidden_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{src} imports {dst}" for src, deps in edges.items() for dst in deps
                  for layer, parts in FORBIDDEN.items() if src.split(".")[0] == layer
                  for part in parts if dst == part or dst.startswith(part + "."))


def test_analysis_never_merges():
    """The analysis counts and compares; merging is the engine's (the dilution toy merges with the methods' own
    functions, merging/methods/whole.py)."""
    assert forbidden_imports(import_edges(modules())) == []
    assert forbidden_imports({"analysis.toy": {"merging.engine.tensor_merge", "merging.methods.whole"}}) == \
        ["analysis.toy imports merging.engine.tensor_merge"]


def stdlib_private_calls(source: str, where: str) -> list[str]:
    """Calls of a standard-library module's private function (`threading._shutdown()`, `os._exit(0)`): undocumented
    interpreter internals, or exits that skip the interpreter's own."""
    found, stdlib = [], {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in sys.stdlib_module_names:
                    stdlib[alias.asname or alias.name.split(".")[0]] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and private(node.func.attr) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in stdlib:
            found.append(f"{where}:{node.lineno}: {node.func.value.id}.{node.func.attr}()")
    return found


def test_no_private_interpreter_calls():
    found = [hit for f in project_files(tuple(RANK)) for hit in stdlib_private_calls(f.read_text(),
                                                                                     str(f.relative_to(ROOT)))]
    assert found == []
    assert stdlib_private_calls("import os, threading as t\nt._shutdown()\nos._exit(0)\nos.getpid()\n", "x.py") == \
        ["x.py:2: t._shutdown()", "x.py:3: os._exit()"]


def test_importing_the_packages_changes_no_environment_variable():
    """Settings of the process (OpenMP's wait policy, progress bars) are made where a command starts — the CLI, the
    app, the Python API's first call — never on import: a program that imports the library keeps its environment."""
    # Libraries that set variables of their own when imported (streamlit: MPLBACKEND; torch's compiler: its cache
    # folder) are imported first: what is measured is our modules' doing.
    code = ("import json, os\nimport numba, pandas, plotly.io, streamlit, torch, torch._dynamo, transformers\n"
            "before = dict(os.environ)\n"
            "import merging, merging.merge, merging.kernels, merging.methods, analysis.stats, analysis.toy, "
            "evaluation.sweep, demo.evaluate, demo.tasks, app.charts, ram_studio, ram_studio.cli\n"
            "after = dict(os.environ)\n"
            "print(json.dumps(sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))))")
    environ = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


ISSUE = re.compile(r"\b[Ii]ssues? ?#?\d+|\b[Ii]ssue[-_]\d+|\b[Ss]top \d+\b|(?<![\w&/#])#\d{1,4}(?![\w-])")
DATA_SUFFIXES = {".json", ".jsonl", ".csv", ".safetensors", ".png", ".jpg", ".svg", ".gif", ".ico", ".woff2"}


def tree_files() -> list[str]:
    """Every file of the repository (tracked, or new and not ignored)."""
    return subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.splitlines()


def issue_numbers(name: str, text: str) -> list[str]:
    """Internal issue references (the word issue or stop and a number, or a number after #) in a file's name and
    text."""
    hits = [f"{name}: {m.group(0)}" for m in ISSUE.finditer(name)]
    for n, line in enumerate(text.splitlines(), 1):
        hits += [f"{name}:{n}: {m.group(0)}" for m in ISSUE.finditer(line)]
    return hits


# Where a test module lives says what it tests: tests/<package>/<sub-package>/test_<what>.py mirrors the code. The
# folders that are not a package's own name test one through its user-facing side.
TEST_HOMES = {"cli": "ram_studio", "api": "ram_studio/api", "browser": "app"}
# the checks of the whole tree and its docs
REPO_WIDE_TESTS = {"test_architecture.py", "test_docs.py", "test_lint.py", "test_repo_docs.py"}


def misplaced_tests(test_files: list[str], package_dirs: set[str]) -> list[str]:
    """The test modules (paths relative to tests/) whose folder is not a package folder of the code."""
    found = []
    for rel in test_files:
        parts = rel.split("/")
        if parts[0] == "benchmarks" or not parts[-1].startswith("test_"):
            continue
        if len(parts) == 1:
            if parts[0] not in REPO_WIDE_TESTS:
                found.append(f"tests/{rel}: at the top of tests/, which holds only the tree-wide checks")
            continue
        home = "/".join([TEST_HOMES.get(parts[0], parts[0]), *parts[1:-1]])
        if home not in package_dirs:
            found.append(f"tests/{rel}: {home}/ is not a package folder of the code")
    return found


def test_test_files_mirror_the_package_layout():
    tests = sorted(str(f.relative_to(ROOT / "tests")) for f in (ROOT / "tests").rglob("test_*.py"))
    packages = {str(f.parent.relative_to(ROOT)) for pkg in RANK for f in (ROOT / pkg).rglob("*.py")}
    assert misplaced_tests(tests, packages) == []
    assert misplaced_tests(["test_trust.py", "merging/nowhere/test_x.py", "cli/test_sweep.py", "conftest.py",
                            "benchmarks/test_x.py", "app/charts/test_rules.py", "test_docs.py"],
                           {"ram_studio", "app", "app/charts", "merging"}) == [
        "tests/test_trust.py: at the top of tests/, which holds only the tree-wide checks",
        "tests/merging/nowhere/test_x.py: merging/nowhere/ is not a package folder of the code"]


def test_no_issue_numbers_anywhere_in_the_tree():
    """Code, comments, test names, config and docs say what a thing does and why, never which issue asked for it
    (data files — results, model weights — are not read)."""
    found = []
    for name in tree_files():
        path = ROOT / name
        if not path.is_file() or path.suffix in DATA_SUFFIXES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += issue_numbers(name, text)
    assert found == []
    # The scan can fail, and leaves colours, anchors and HTML entities alone. (The samples are assembled at run
    # time, so that this file passes its own scan.)
    word, name = "issue", f"results-{'issue'}{24}.json"
    assert issue_numbers(name, f"see {word} 3, #{31}; Stop {27}\nfix for {word}s {12}\n") == [
        f"{name}: {word}24", f"{name}:1: {word} 3", f"{name}:1: #{31}", f"{name}:1: Stop {27}", f"{name}:2: {word}s 12"]
    assert issue_numbers("x.py", 'c = ["#0072B2", "#999933"]; "&#39;"; [a](#section-2)\n') == []


# Paths a comment names that are not files of the repository on purpose (it says why they are absent).
NOT_FILES = {"app/pages"}  # app/main.py: the page scripts live in app/views/, not app/pages/
PATH_WORD = re.compile(r"(?<![\w./-])((?:%s)/[\w./*-]*[\w*]|test_\w+\.py)\b" % "|".join(
    re.escape(p) for p in ("merging", "analysis", "evaluation", "demo", "assets", "ram_studio", "app", "tests",
                           "docs", ".ci", ".streamlit")))


def stale_references(where: str, source: str, files: list[str]) -> list[str]:
    """Repository paths (`merging/…`, `tests/…`, a test file by its name) a comment or docstring names that do not
    exist: a file moved, renamed or removed without its references. `*` and upper-case words (DATE, NAME) are
    placeholders."""
    found = []
    for line, text in comments_and_docstrings(source):
        for match in PATH_WORD.finditer(text):
            word = match.group(1).rstrip(".")
            parts = re.split(r"(\*|[A-Z]{3,})", word)
            pattern = re.compile("^" + "".join("[^/]*" if i % 2 else re.escape(p) for i, p in enumerate(parts))
                                 + "(/|$)")
            bare = "/" not in word  # a test file named alone: anywhere under tests/
            exists = any(pattern.match(f) or (bare and f.endswith("/" + word)) for f in files)
            if not exists and word not in NOT_FILES:
                found.append(f"{where}:{line}: {word}")
    return found


def test_every_path_a_comment_names_exists():
    files = tree_files()
    found = [hit for f in project_files() for hit in stale_references(str(f.relative_to(ROOT)), f.read_text(), files)]
    assert found == []
    sample = ('"""Checked by tests/test_kernels.py and test_units.py (merging/regions.py, merging/methods/*.py)."""\n'
              "# writes tests/benchmarks/results-DATE.json, not app/pages\n")
    assert stale_references("x.py", sample, ["tests/test_kernels.py", "merging/methods/ram.py",
                                             "tests/benchmarks/results-2026-11-24.json"]) == \
        ["x.py:1: test_units.py", "x.py:1: merging/regions.py"]


def widget_keys(path: Path) -> tuple[set[str], set[str]]:
    """The widget and session-state keys a module names as literals (`key="…"`, `st.session_state["…"]`,
    `…_KEY = "…"`), and every string literal in it."""
    keys, strings = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.add(node.value)
        literal = None
        if isinstance(node, ast.keyword) and node.arg == "key":
            literal = node.value
        elif isinstance(node, ast.Subscript) and "session_state" in ast.unparse(node.value):
            literal = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
                and "session_state" in ast.unparse(node.func.value):
            literal = node.args[0]
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith("KEY")
                                                  for t in node.targets):
            literal = node.value
        if isinstance(literal, ast.Constant) and isinstance(literal.value, str):
            keys.add(literal.value)
    return keys, strings


def keys_written_twice(paths: list[Path]) -> list[str]:
    """Widget keys whose literal appears in more than one of `paths`."""
    found = {p: widget_keys(p) for p in paths}
    return sorted(f"{key}: {', '.join(sorted(p.name for p, (_, strings) in found.items() if key in strings))}"
                  for key in set().union(*(keys for keys, _ in found.values()))
                  if sum(key in strings for _, strings in found.values()) > 1)


def test_every_widget_key_is_written_in_one_module(tmp_path):
    """A key two modules share (the Merge form's, filled by the mergekit panel and the Sweep page) is a constant of
    one of them (app/forms.py for the Merge form), imported by the others: never the same literal twice."""
    assert keys_written_twice(sorted((ROOT / "app").rglob("*.py"))) == []
    (tmp_path / "forms.py").write_text('METHOD_KEY = "merge_method"\n')
    (tmp_path / "page.py").write_text('st.selectbox("Method", [], key="merge_method")\nst.session_state["own"] = 1\n')
    (tmp_path / "other.py").write_text('x = st.session_state.get("own")\n')
    assert keys_written_twice(sorted(tmp_path.glob("*.py"))) == ["merge_method: forms.py, page.py",
                                                                  "own: other.py, page.py"]


# ---------------------------------------------------------------- assets/ is data

# The Python files allowed under assets/: the package marker that makes setuptools ship the data, and the lm-eval
# glue the demo's task YAML files name (`!function utils.…`), which lm-eval loads from the YAML file's own folder.
ASSET_MODULES = {"assets/__init__.py", "assets/demo/lm_eval_tasks/utils.py"}
CODE_SUFFIXES = (".py", ".pyw", ".pyx", ".pyi", ".so", ".pyd")


def code_in_assets(files: list[str]) -> list[str]:
    """The code files under assets/ other than ASSET_MODULES."""
    return sorted(f for f in files if f.startswith("assets/") and f.endswith(CODE_SUFFIXES) and f not in ASSET_MODULES)


def test_assets_hold_data_and_no_code():
    """The demo's code is the `demo` package; assets/ keeps its data (models, results, grids, the lm-eval task files)
    and the images. The one module there is needed where it is: the task YAML files name it."""
    files = tree_files()
    assert code_in_assets(files) == []
    assert ASSET_MODULES <= set(files)  # the exceptions are real files, not stale names
    assert "!function utils.load" in (ROOT / "assets" / "demo" / "lm_eval_tasks" / "_ram_demo.yaml").read_text()
    assert code_in_assets(["assets/demo/train.py", "assets/__init__.py", "assets/demo/tasks/x.pyi", "demo/train.py",
                           "assets/demo/lm_eval_tasks/utils.py", "assets/demo/table1_grids.yaml"]) == \
        ["assets/demo/tasks/x.pyi", "assets/demo/train.py"]


# ---------------------------------------------------------------- a demo task is one declaration

REVERSE = '''"""reverse: write a short word backwards — a demo task added by the architecture test."""
from __future__ import annotations

import random

from demo.tasks.base import SEPARATOR, DemoTask, Example, Raw, declare


def generate(rng: random.Random, index: int = 0) -> Raw:
    """A word of 3-5 letters; the answer is the word reversed, the habit the word as it was."""
    word = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 5)))
    return f"R:{word}{SEPARATOR}", word[::-1], str(len(word)), word


def verify(example: Example, output: str) -> bool:
    return output.strip() == example.answer


declare(DemoTask("reverse", "write a short word backwards", seed_offset=300_000, generate=generate, verify=verify,
                 max_new_tokens=6, by_subset=True))
'''

# Runs inside the copy: the suites and the Sweep page's task list (an AppTest), as JSON.
TASK_DRIVER = '''import faulthandler, json
faulthandler.dump_traceback_later(250, exit=True)  # a hang fails the test with every thread's traceback
from pathlib import Path
from streamlit.testing.v1 import AppTest
from demo.suites import get_suite
from demo.tasks import TASKS, reward, sample_train
shared = get_suite("shared")
example = shared.eval_set("reverse", "test", 1)[0]
at = AppTest.from_file(str(Path.cwd() / "app" / "main.py"), default_timeout=200)
at.switch_page("views/sweep.py").run()
print(json.dumps({"tasks": list(TASKS), "demo": list(get_suite("demo").tasks), "shared": list(shared.tasks),
                  "budget": shared.max_new_tokens["reverse"], "subset_tasks": list(shared.subset_tasks),
                  "example": [example.prompt, example.answer], "verified": shared.verify(example, example.answer),
                  "reward": reward(get_suite("demo").eval_set("reverse", "test", 1)[0], "x"),
                  "page": list(at.multiselect(key="sweep_tasks").options),
                  "exceptions": [str(e.value) for e in at.exception]}))
'''


@pytest.mark.timeout(1200)
def test_adding_a_demo_task_is_one_declaration(tmp_path):
    """One new file in demo/tasks/ — and nothing else, but running the lm-eval files' generator — gives a
    task that both suites hold (the shared one with its envelope and budget), that `make_data` writes as lm-eval
    task files and data, that the CLI lists, accepts and scores (the built-in evaluator and lm-eval agreeing), and
    that the Sweep page offers; the existing tasks' data stays byte for byte the same."""
    copy = repository_copy(tmp_path / "repo")
    tasks_dir = copy / "assets" / "demo" / "lm_eval_tasks"
    before = {p.name: p.read_bytes() for p in sorted(tasks_dir.rglob("*")) if p.is_file() and p.suffix != ".pyc"}
    (copy / "demo" / "tasks" / "reverse.py").write_text(REVERSE)
    (tmp_path / "drive_tasks.py").write_text(TASK_DRIVER)
    env = dict(HF_DATASETS_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "datasets"),
               RAM_STUDIO_CACHE=str(tmp_path / "cache"), RAM_STUDIO_SWEEP_CACHE=str(tmp_path / "sweeps"))

    stale = subprocess.run([sys.executable, "-m", "demo.lm_eval_tasks.make_data", "--check"], cwd=copy,
                           env={**os.environ, "PYTHONPATH": str(copy)}, capture_output=True, text=True, timeout=300)
    assert stale.returncode == 1 and "ram_demo_reverse.yaml" in stale.stderr and "reverse_test.jsonl" in stale.stderr
    run_in(copy, ["-m", "demo.lm_eval_tasks.make_data"])
    run_in(copy, ["-m", "demo.lm_eval_tasks.make_data", "--check"])
    after = {p.name: p.read_bytes() for p in sorted(tasks_dir.rglob("*")) if p.is_file() and p.suffix != ".pyc"}
    assert {n for n in after if after[n] != before.get(n)} == {
        "ram_demo.yaml", "ram_demo_validation.yaml", "ram_demo_reverse.yaml", "ram_demo_reverse_validation.yaml",
        "reverse_validation.jsonl", "reverse_test.jsonl"}  # the groups gain the task; nothing else changes
    assert b"  - ram_demo_reverse\n" in after["ram_demo.yaml"]
    assert b"max_gen_toks: 6\n" in after["ram_demo_reverse.yaml"]
    rows = [json.loads(line) for line in after["reverse_test.jsonl"].decode().splitlines()]
    assert len(rows) == 300 and all(r["answer"] == r["habit"][::-1] and r["max_new_tokens"] == 6 for r in rows)

    report = json.loads(run_in(copy, [str(tmp_path / "drive_tasks.py")], **env).stdout.strip().splitlines()[-1])
    assert report["exceptions"] == []
    assert report["tasks"] == report["demo"] == report["shared"] == ["code", "tool", "memory", "reverse"]
    assert report["budget"] == 6 + 4 and report["subset_tasks"] == ["memory", "reverse"]  # the envelope's 4 tokens
    prompt, answer = report["example"]
    assert prompt.startswith("R:") and answer.endswith("</a>") and report["verified"] and report["reward"] == 0.0
    assert report["page"] == ["code", "tool", "memory", "reverse"]

    listed = run_in(copy, ["-m", "ram_studio", "tasks"]).stdout
    assert "reverse" in listed and "write a short word backwards" in listed
    helped = run_in(copy, ["-m", "ram_studio", "evaluate", "--help"]).stdout
    assert "code,tool,memory,reverse" in helped.replace("\n", "")
    scores = {}
    for how, extra in (("demo", ["--tasks", "reverse"]),
                       ("lm-eval", ["--lm-eval", "ram_demo_reverse", "--include-path", str(tasks_dir)])):
        out = tmp_path / f"{how}.json"
        run_in(copy, ["-m", "ram_studio", "evaluate", "demo:base", *extra, "--limit", "6", "--json", str(out),
                      "--quiet"], **env)
        scores[how] = json.loads(out.read_text())["scores"]
    assert list(scores["demo"]) == ["reverse"] and list(scores["lm-eval"]) == ["ram_demo_reverse"]
    assert scores["demo"]["reverse"] == pytest.approx(scores["lm-eval"]["ram_demo_reverse"], abs=1e-9)

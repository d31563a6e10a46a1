"""The layers point down and no module imports itself back: app, ram_studio → assets → evaluation → analysis → merging.

Every import is counted, including those inside functions. Two documented exceptions: `merging/__main__.py`,
the `python -m merging` alias of the CLI, is an entry point that nothing imports; and `ram_studio` (the CLI and
the Python API) may import the app's figure builders, `app.charts` (pure: frames in, plotly figures out), so the
API returns the same figures the pages draw — nothing else of the app.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
# Higher rank = higher layer; a module may import its own package or lower ranks only.
RANK = {"merging": 0, "analysis": 1, "evaluation": 2, "assets": 3, "ram_studio": 4, "app": 4}
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
         "merging.recipe": 4, "merging.presets": 4, "merging.reading": 3, "merging.methods": 2, "merging.kernels": 1, "merging.common": 0,
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
    for name, path in sorted(modules().items()):
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
    real = import_edges(modules())
    assert "merging.merge" in real and "merging.engine.counts" in real["merging.merge"]  # the parser sees imports


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
        done = run_in(copy, [str(tmp_path / "drive_cli.py"), "merge", *inputs, "--method", "half_sum", "--half-factor", "0.5",
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

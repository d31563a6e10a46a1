"""The layers point down and no module imports itself back: app, ram_studio → assets → evaluation → analysis → merging.

Every import is counted, including those inside functions. One documented exception: `merging/__main__.py`,
the `python -m merging` alias of the CLI, is an entry point that nothing imports.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Higher rank = higher layer; a module may import its own package or lower ranks only.
RANK = {"merging": 0, "analysis": 1, "evaluation": 2, "assets": 3, "ram_studio": 4, "app": 4}
ENTRY_POINTS = {"merging.__main__"}


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
             "merging.engine.loop": {"merging.merge"}, "app.state": {"ram_studio.cli"}, "ram_studio.cli": set()}
    assert upward_imports(edges) == ["app.state imports ram_studio.cli", "merging.merge imports analysis.stats"]
    assert cycles(edges) == [["analysis.stats", "merging.engine.loop", "merging.merge", "analysis.stats"]]
    real = import_edges(modules())
    assert "merging.merge" in real and "merging.engine.counts" in real["merging.merge"]  # the parser sees imports


def test_adding_a_method_is_one_file():
    """Method modules are discovered: the package imports every module in merging/methods/."""
    from merging.methods import METHODS

    files = {p.stem for p in (ROOT / "merging" / "methods").glob("*.py")} - {"__init__", "base", "params", "registry", "regions"}
    owners = {m.merge.__module__.rsplit(".", 1)[-1] for m in METHODS.values()}
    assert owners == files

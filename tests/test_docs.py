"""The docs keep their promises: the README is a front door (≤ 250 lines, no line over 200 characters outside
tables and code); no internal issue number or commit hash in the README, docs/, the CHANGELOG or any code comment
or docstring; and every command, flag, file path, Python name and JSON key a page names exists (flags against the
real parsers, paths against the tree, JSON keys against real outputs). Links between the pages resolve."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.source_text import comments_and_docstrings

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "assets/demo/README.md", "tests/benchmarks/README.md",
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
NOTEBOOKS = sorted((ROOT / "docs").rglob("*.ipynb"))
README_LINES, LINE_CHARS = 250, 200


def text_of(page: str) -> str:
    return (ROOT / page).read_text()


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


# ---------------------------------------------------------------- the front door

def test_readme_is_a_front_door():
    text = text_of("README.md")
    assert len(text.splitlines()) <= README_LINES
    long = [line for line in prose_lines(text) if len(line) > LINE_CHARS and not line.lstrip().startswith("|")]
    assert long == []
    for page in ("docs/app.md", "docs/cli.md", "docs/models.md", "docs/methods.md", "docs/analysis.md",
                 "docs/evaluation.md", "docs/mergekit.md", "docs/security.md", "docs/performance.md",
                 "docs/architecture.md", "docs/python-api.md", "docs/tutorials/signal-dilution.ipynb", "LICENSE",
                 "CITATION.cff", "CHANGELOG.md"):
        assert f"]({page})" in text, page  # the README links every page


def test_license_and_citation_are_named_by_the_package():
    import tomllib

    import ram_studio

    meta = tomllib.loads(text_of("pyproject.toml"))["project"]
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    licence = text_of("LICENSE")
    assert licence.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in licence
    cff = text_of("CITATION.cff")
    assert f"version: {ram_studio.__version__}\n" in cff and "license: Apache-2.0" in cff and "2601.13572" in cff
    assert "include CITATION.cff" in text_of("MANIFEST.in")


# ---------------------------------------------------------------- no internal issue numbers or commit hashes

ISSUE = re.compile(r"\b[Ii]ssues? \d+|\b[Ii]ssue-\d+|\bstop \d+\b|(?<![\w&/#])#\d+\b")
HASH = re.compile(r"(?<![\w/.@-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
# A measurement's provenance in docs/performance.md names the commit of the code measured, in this one form.
PROVENANCE = re.compile(r"code: commit `[0-9a-f]{7,40}`")
SKIP_DIRS = {".git", ".venv", ".bench", ".explore", "node_modules", "__pycache__"}


def internal_references(text: str) -> list[str]:
    text = PROVENANCE.sub("", text)
    return [m.group(0) for m in (*ISSUE.finditer(text), *HASH.finditer(text))]


def test_the_scan_can_fail():
    # The samples are assembled at run time, so that this file itself passes the tree-wide scan for issue numbers.
    word, n = "issue", 14
    assert internal_references(f"as {word} {n}'s targets said; see #{n + 17}, stop {n + 13} and commit e695bdd") == \
        [f"{word} {n}", f"#{n + 17}", f"stop {n + 13}", "e695bdd"]
    assert internal_references("code: commit `33628d5`; ε = 1e-5; sha256; 0.99 GB; demo:code; 128 MB") == []
    source = f'"""{word.title()} {n + 6}: x."""\ny = 1  # see {word} 3\n'
    assert comments_and_docstrings(source) == [(2, f"# see {word} 3"), (1, f"{word.title()} {n + 6}: x.")]


def test_no_internal_issue_numbers_or_commit_hashes():
    hits = []
    for page in PAGES:
        for n, line in enumerate(text_of(page).splitlines(), 1):
            if page != "docs/performance.md":
                line = line.replace("code: commit", "")  # the provenance form is for performance.md only
            hits += [f"{page}:{n}: {h}" for h in internal_references(line)
                     if page == "docs/performance.md" or not PROVENANCE.search(line)]
    for nb in NOTEBOOKS:
        for cell in json.loads(nb.read_text())["cells"]:
            hits += [f"{nb.name}: {h}" for h in internal_references("".join(cell["source"]))]
    for path in sorted(ROOT.rglob("*.py")):
        if SKIP_DIRS & set(path.relative_to(ROOT).parts):
            continue
        for line, text in comments_and_docstrings(path.read_text()):
            hits += [f"{path.relative_to(ROOT)}:{line}: {h}" for h in internal_references(text)]
    assert hits == []


# ---------------------------------------------------------------- every command, flag and path exists

def ram_studio_flags() -> dict[str, set[str]]:
    """Each subcommand's flags (method flags included), and under "" the command's own (--version), from the real
    parser."""
    import argparse

    from ram_studio.cli import build_parser

    top = build_parser(True)
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return {"": {s for a in top._actions for s in a.option_strings},
            **{name: {s for a in p._actions for s in a.option_strings} for name, p in sub.choices.items()}}


# Flags of other tools a page quotes, by the tool: lm-evaluation-harness's CLI, Streamlit, the RAM authors' script.
EXTERNAL = {"lm_eval": {"--model", "--model_args", "--tasks", "--include_path", "--batch_size", "--limit"},
            "streamlit": {"--server.address", "--server.port"},
            "prose": {"--rescale_factor", "--include_path", "--help"}}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_.-]*[a-z0-9]")
COMMAND = re.compile(r"(?:ram-studio|python -m ram_studio|python -m merging)\s+([a-z]+)")
MODULE = re.compile(r"python -m ((?:demo|tests|merging)(?:\.[a-z_0-9]+)+)")


def segments(text: str) -> list[str]:
    """What a flag belongs to: each command of a code block (continuation lines joined), each inline code span
    (also one that wraps onto the next line) and each prose line."""
    out, fenced, block = [], False, []
    for line in text.splitlines():
        if line.startswith("```"):
            if fenced:
                out += _commands(block)
            fenced, block = not fenced, []
        elif fenced:
            block.append(line)
    prose = "\n".join(prose_lines(text))
    out += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]
    out += re.sub(r"`[^`]+`", " ", prose).splitlines()
    return out


def _commands(lines: list[str]) -> list[str]:
    """A code block's commands: a line ending in '\\' or followed by indented lines continues."""
    out: list[str] = []
    for line in lines:
        if out and (out[-1].endswith("\\") or (line.startswith(" ") and not line.strip().startswith("#"))):
            out[-1] = out[-1].rstrip("\\") + " " + line.strip()
        else:
            out.append(line)
    return out


def module_source(module: str) -> str:
    path = ROOT / Path(*module.split("."))
    files = [path.with_suffix(".py")] if path.with_suffix(".py").exists() else list(path.glob("*.py"))
    return "".join(f.read_text() for f in files)


def page_modules(text: str) -> str:
    """The sources of the project modules a page runs (`python -m demo.build` …): a flag named in its prose
    (`--reuse-base`) may be one of theirs."""
    return "".join(module_source(m) for m in sorted(set(MODULE.findall(text))))


def unknown_flags(segment: str, parsers: dict[str, set[str]], modules: str = "") -> list[str]:
    flags = FLAG.findall(segment)
    if not flags:
        return []
    command, module = COMMAND.search(segment), MODULE.search(segment)
    if command:
        known = parsers.get(command.group(1))
        if known is None:
            return [f"ram-studio {command.group(1)}"]
    elif module:
        source = module_source(module.group(1))
        return [f for f in flags if f'"{f}"' not in source and f"'{f}'" not in source]
    elif "lm_eval" in segment:
        known = EXTERNAL["lm_eval"]
    elif "streamlit run" in segment:
        known = EXTERNAL["streamlit"]
    else:
        known = set().union(*parsers.values(), EXTERNAL["prose"], EXTERNAL["lm_eval"])
        known |= {f for f in flags if f'"{f}"' in modules or f"'{f}'" in modules}
    return [f for f in flags if f not in known and f.replace("--no-", "--") not in known]


def test_the_flag_check_can_fail():
    parsers = ram_studio_flags()
    assert unknown_flags("ram-studio merge BASE A --method ram --out x --colour blue", parsers) == ["--colour"]
    assert unknown_flags("ram-studio analyse demo:base --json x", parsers) == ["ram-studio analyse"]
    assert unknown_flags("python -m demo.build --suite shared --fast", parsers) == ["--fast"]
    assert unknown_flags("pass --dilute or --no-dilute, never --sideways", parsers) == ["--sideways"]
    build = module_source("demo.build")
    assert unknown_flags("then --reuse-base DIR", parsers, build) == [] and unknown_flags("--reuse-base", parsers) \
        == ["--reuse-base"]
    assert "python -m x --set DIR" in segments("a `python -m x\n--set DIR` b")


def test_every_command_and_flag_a_page_names_exists():
    parsers = ram_studio_flags()
    bad = []
    for page in PAGES:
        modules = page_modules(text_of(page))
        for seg in segments(text_of(page)):
            bad += [f"{page}: {f} in {seg.strip()[:80]!r}" for f in unknown_flags(seg, parsers, modules)]
            bad += [f"{page}: {m} in {seg.strip()[:80]!r}" for m in COMMAND.findall(seg) if m not in parsers]
    assert bad == []


TRACKED = None
PATH = re.compile(r"^\.?[\w.-]+(?:/[\w.*{},<>-]+)*/?$")
SUFFIXES = (".py", ".md", ".json", ".yaml", ".yml", ".csv", ".toml", ".txt", ".cff", ".ipynb", ".png", ".jsonl", ".sh")
TOP = ("app/", "analysis/", "merging/", "evaluation/", "demo/", "assets/", "tests/", "docs/", "ram_studio/", ".ci/",
       ".streamlit/")
# Files a page names that a command writes or reads at run time, not files of this repository.
WRITTEN = {"README.md", "config.json", "ram_recipe.json", "mergekit.yaml", "model.safetensors",
           "model.safetensors.index.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
           "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
           "chat_template.json", "chat_template.jinja", "preprocessor_config.json", "tokenizer.model",
           "processor_config.json", "video_preprocessor_config.json", "image_processor_config.json",
           "feature_extractor_config.json", "audio_processor_config.json",  # a model's processor files
           "adapter_config.json", "stats.json", "scores.json", "sweep.json", "sweep.csv", "sweep-bench.json",
           "density.html", "table1.csv", "table1.md", "table1_validation_search.csv", "fig3.csv",
           "fig3.md", "accuracy.csv", "accuracy.md", "training_log.csv", "build_info.json", "utils.py",
           "notes.txt",  # a file in an error message's example
           "ram-main.py"}  # the RAM authors' script, in their repository


def tracked() -> list[str]:
    global TRACKED
    if TRACKED is None:
        TRACKED = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout.splitlines()
    return TRACKED


def path_exists(name: str) -> bool:
    """A path a page names: relative to the root, or the end of a tracked path (a module named inside its
    package's section); globs and {a,b} alternatives expanded."""
    name = name.split(":")[0].rstrip("/")
    if "{" in name:
        head, rest = name.split("{", 1)
        alts, tail = rest.split("}", 1)
        return all(path_exists(head + a + tail) for a in alts.split(","))
    if "*" in name or "<" in name:
        pattern = re.escape(name).replace(r"\*", "[^/]*")
        pattern = re.sub(r"<[^>]*>", "[^/]+", pattern.replace(r"\<", "<").replace(r"\>", ">"))
        return any(re.search(f"(^|/){pattern}($|/)", t) for t in tracked())
    return (ROOT / name).exists() or any(t == name or t.endswith("/" + name) or t.startswith(name + "/")
                                         for t in tracked())


def named_paths(text: str) -> list[str]:
    out = []
    for span in re.findall(r"`([^`\n]+)`", text):
        for word in span.split():
            word = word.strip(",;()").split(":")[0]
            stem = word.rsplit("/", 1)[-1].split(".")[0]
            if not PATH.match(word) or word in WRITTEN or word.startswith(("http", "~", "$")) or stem.isupper():
                continue  # a URL, a home or variable path, or a placeholder (OUT.json, CONFIG.yml)
            if word.startswith(TOP) or word.endswith(SUFFIXES):
                out.append(word)
    return out


def test_the_path_check_can_fail():
    assert path_exists("merging/writing/placement.py") and path_exists("placement.py")
    assert path_exists("tests/benchmarks/results-ab-analyze-diagnostics-*.json")
    assert path_exists("assets/demo/models-shared/{base,code,tool,memory}")
    assert not path_exists("merging/writing/nowhere.py") and not path_exists("assets/demo/{base,nope}")
    assert named_paths("see `app/views/x.py` and `ram_recipe.json`, `analysis/stats.py: analyze`") == \
        ["app/views/x.py", "analysis/stats.py"]


def test_every_file_path_a_page_names_exists():
    missing = [f"{page}: {p}" for page in PAGES for p in named_paths(text_of(page)) if not path_exists(p)]
    assert missing == []


PYNAME = re.compile(r"^(?:merging|analysis|evaluation|demo|ram_studio|app)(?:\.[A-Za-z_][\w]*)+$")


def test_every_python_name_a_page_names_exists():
    """`merging.methods.base.agent_seed_keys`, `analysis.stats.cached_result`, … import and resolve."""
    import importlib

    missing = []
    for page in PAGES:
        for span in re.findall(r"`([^`\n]+)`", text_of(page)):
            name = span.split("(")[0].strip()
            if not PYNAME.match(name):
                continue
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                try:
                    for attr in parts[cut:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    missing.append(f"{page}: {name}")
                break
            else:
                missing.append(f"{page}: {name}")
    assert missing == []


# ---------------------------------------------------------------- JSON keys against real outputs

def documented_keys(text: str) -> set[str]:
    """Quoted keys inside the JSON shapes a page gives (code spans that start with { or [{; a quoted value after
    a colon is not a key)."""
    keys: set[str] = set()
    for span in re.findall(r"`(\{\"[^`]+|\[\{\"[^`]+)`", text.replace("\n", " ")):
        keys |= set(re.findall(r'(?<!: )(?<!\|)"([a-z_@0-9]+)"', span))
    return keys


def all_keys(doc) -> set[str]:
    if isinstance(doc, dict):
        return set(doc) | set().union(*(all_keys(v) for v in doc.values()))
    if isinstance(doc, list):
        return set().union(*(all_keys(v) for v in doc)) if doc else set()
    return set()


def test_the_key_check_can_fail():
    assert documented_keys('writes `{"eps": [...], "agents": [{"name", "rho"}], "kind": "demo"|"lm"}` and `{"x"}`') \
        == {"eps", "agents", "name", "rho", "kind", "x"}
    assert all_keys({"a": [{"b": 1}], "c": {"d": None}}) == {"a", "b", "c", "d"}


def test_every_json_key_a_page_names_is_in_a_real_output(tmp_path):
    """The keys the docs give for `analyze --json`, `evaluate --json` and `sweep --json` (and the merge's index)
    against those documents written on the demo."""
    from ram_studio import analyze, evaluate, merge, sweep

    real = all_keys(analyze("demo:base", ["demo:code", "demo:tool"], eps_ladder=[1e-5], progress=False).to_json())
    real |= all_keys(evaluate("demo:tool", tasks="memory,tool", limit=2, progress=False).to_json())
    # two methods, one of them searched: the chosen are compared pair by pair and a grid edge can be named
    real |= all_keys(sweep("demo:base", ["demo:code", "demo:tool"], try_=["average", "task_arithmetic lambda=0.5,1.0"],
                           limit=2, progress=False, tasks="tool").to_json())
    merged = merge("demo:base", ["demo:code", "demo:tool"], method="average", out=tmp_path / "m", shard_size="300KB",
                   progress=False)
    real |= all_keys(json.loads((merged.out / "model.safetensors.index.json").read_text()))
    real |= all_keys(merged.recipe)
    outputs = [p for p in PAGES if p != "docs/python-api.md"]  # its mappings are the API's inputs (sweep grids)
    documented = set().union(*(documented_keys(text_of(p)) for p in outputs))
    assert documented and documented - real == set()


# ---------------------------------------------------------------- links

def anchors(path: Path) -> set[str]:
    out = set()
    for line in prose_lines(path.read_text()):
        m = re.match(r"^#+\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES)
def test_links_between_pages_resolve(page):
    source = ROOT / page
    text = "\n".join(prose_lines(source.read_text()))
    text = re.sub(r"`[^`]*`", "", text)
    broken = []
    for m in re.finditer(r"\]\(([^)\s]+)\)|src=\"([^\"]+)\"", text):
        link = m.group(1) or m.group(2)
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        target, _, anchor = link.partition("#")
        path = (source.parent / target) if target else source
        if not path.exists():
            broken.append(link)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(link)
    assert broken == []

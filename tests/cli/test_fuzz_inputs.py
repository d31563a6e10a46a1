"""Property-based fuzzing of everything a user hands us: safetensors headers, index files, config.json and
recipes are mutated at random (hypothesis). Whatever the mutation, the CLI must answer either with exit 0
and a valid, finite model, or with exit 2 and one line `error: …` — never a traceback, never another exit
code, and never a change to any input file."""
from __future__ import annotations

import io
import json
import os
import shutil
import struct
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from ram_studio.cli import main
from tests.factory import checksums
from tests.factory import join_safetensors as _join
from tests.factory import split_safetensors as _split

# CI runs a fixed, derandomized set; RAM_STUDIO_FUZZ_EXAMPLES=N explores N random examples per target.
_DEEP = int(os.environ.get("RAM_STUDIO_FUZZ_EXAMPLES", "0"))
SETTINGS = settings(max_examples=_DEEP or 30, deadline=None, derandomize=not _DEEP, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2 ** 70, max_value=2 ** 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)
methods = st.sampled_from([["ram"], ["ram_plus"], ["ties", "--density", "0.3"]])


def run_cli(*argv) -> tuple[int, str, str]:
    """The CLI in-process, in a scratch working directory of its own (a recipe's recorded output name lands in
    `./NAME`); any exception escaping main() fails the property (hypothesis shows it)."""
    out, err = io.StringIO(), io.StringIO()
    here, scratch = os.getcwd(), tempfile.mkdtemp(prefix="fuzz-cwd-")
    try:
        os.chdir(scratch)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as exc:  # argparse usage errors
                code = exc.code
    finally:
        os.chdir(here)
        shutil.rmtree(scratch, ignore_errors=True)
    return code, out.getvalue(), err.getvalue()


def check_outcome(code: int, err: str, out_dir: Path | None) -> None:
    assert code in (0, 2), (code, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
        if out_dir is not None:
            assert not out_dir.exists()
    elif out_dir is not None:
        for shard in out_dir.glob("*.safetensors"):
            with safe_open(str(shard), "pt") as f:
                for name in f.keys():
                    t = f.get_tensor(name)
                    assert not t.is_floating_point() or bool(torch.isfinite(t.float()).all()), name
        json.loads((out_dir / "config.json").read_text())


def run_file(family, name: str, text: str) -> None:
    """`run` a recipe or mergekit config file holding `text`: one clear outcome, and the inputs unchanged."""
    base, agents = family
    before = checksums([base, *agents])
    root = Path(tempfile.mkdtemp(prefix="fuzz-run-"))
    try:
        path = root / name
        path.write_text(text)
        out = root / "out"
        code, _, err = run_cli("run", path, "--out", out, "--quiet")
        check_outcome(code, err, out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert checksums([base, *agents]) == before


class Workspace:
    """A fresh copy of the tiny family per example, hashed before the run."""

    def __init__(self, family) -> None:
        base, agents = family
        self.root = Path(tempfile.mkdtemp(prefix="fuzz-"))
        self.models = [shutil.copytree(p, self.root / "in" / p.name) for p in [base, *agents[:2]]]
        self.out = self.root / "out"

    def __enter__(self) -> "Workspace":
        return self

    def hashes(self) -> dict:
        return checksums([self.root / "in"])

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def merge_and_check(ws: Workspace, method: list[str], extra=()) -> None:
    before = ws.hashes()
    code, _, err = run_cli("merge", *ws.models, "--method", *method, "--out", ws.out, "--quiet", *extra)
    check_outcome(code, err, ws.out)
    code, _, err = run_cli("inspect", *ws.models)
    check_outcome(code, err, None)
    assert ws.hashes() == before


@SETTINGS
@given(data=st.data(), method=methods)
def test_fuzz_safetensors_headers(family, data, method):
    with Workspace(family) as ws:
        shard = sorted(ws.models[1].glob("*.safetensors"))[0]
        header, body = _split(shard)
        names = [k for k in header if k != "__metadata__"]
        op = data.draw(st.sampled_from(["field", "drop_field", "entry", "metadata", "length", "truncate",
                                        "append", "flip"]))
        if op == "field":
            name = data.draw(st.sampled_from(names))
            header[name][data.draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = data.draw(json_values)
            _join(shard, header, body)
        elif op == "drop_field":
            name = data.draw(st.sampled_from(names))
            header[name].pop(data.draw(st.sampled_from(["dtype", "shape", "data_offsets"])))
            _join(shard, header, body)
        elif op == "entry":
            header[data.draw(st.sampled_from(names + ["x", ""]))] = data.draw(json_values)
            _join(shard, header, body)
        elif op == "metadata":
            header["__metadata__"] = data.draw(json_values)
            _join(shard, header, body)
        else:
            raw = bytearray(shard.read_bytes())
            if op == "length":
                raw[:8] = struct.pack("<Q", data.draw(st.integers(0, 2 ** 64 - 1)))
            elif op == "truncate":
                del raw[data.draw(st.integers(0, len(raw) - 1)):]
            elif op == "append":
                raw += data.draw(st.binary(min_size=1, max_size=64))
            else:
                i = data.draw(st.integers(0, len(raw) - 1))
                raw[i] ^= data.draw(st.integers(1, 255))
            shard.write_bytes(bytes(raw))
        merge_and_check(ws, method)


@SETTINGS
@given(data=st.data(), method=methods)
def test_fuzz_index_files(family, data, method):
    with Workspace(family) as ws:
        index = ws.models[2] / "model.safetensors.index.json"
        doc = json.loads(index.read_text())
        op = data.draw(st.sampled_from(["value", "key", "weight_map", "document", "truncate"]))
        wm = doc["weight_map"]
        if op == "value":
            wm[data.draw(st.sampled_from(sorted(wm)))] = data.draw(
                json_values | st.sampled_from(["../x.safetensors", "/etc/passwd", "config.json", "", "."]))
        elif op == "key":
            wm[data.draw(st.text(max_size=20))] = data.draw(st.sampled_from(sorted(set(wm.values()))))
        elif op == "weight_map":
            doc["weight_map"] = data.draw(json_values)
        elif op == "document":
            doc = data.draw(json_values)
        text = json.dumps(doc)
        if op == "truncate":
            text = text[:data.draw(st.integers(0, len(text) - 1))]
        index.write_text(text)
        merge_and_check(ws, method)


@SETTINGS
@given(data=st.data(), method=methods)
def test_fuzz_config_json(family, data, method):
    with Workspace(family) as ws:
        target = ws.models[data.draw(st.integers(0, 2))] / "config.json"
        cfg = json.loads(target.read_text())
        op = data.draw(st.sampled_from(["field", "document", "bytes"]))
        if op == "field":
            cfg[data.draw(st.sampled_from(["architectures", "model_type", "tie_word_embeddings", "torch_dtype",
                                           "vocab_size"]))] = data.draw(json_values)
            target.write_text(json.dumps(cfg))
        elif op == "document":
            target.write_text(json.dumps(data.draw(json_values)))
        else:
            target.write_bytes(data.draw(st.binary(max_size=64)))
        merge_and_check(ws, method)


@pytest.fixture(scope="module")
def recipe(family, tmp_path_factory):
    """A real recipe written by a merge of the family (the fuzzer mutates copies of it)."""
    out = tmp_path_factory.mktemp("recipe") / "merged"
    base, agents = family
    assert main(["merge", str(base), *map(str, agents[:2]), "--method", "ram_plus", "--out", str(out), "--quiet"]) == 0
    return json.loads((out / "ram_recipe.json").read_text())


@SETTINGS
@given(data=st.data())
def test_fuzz_recipes(family, recipe, data):
    doc = json.loads(json.dumps(recipe))
    op = data.draw(st.sampled_from(["spec_field", "drop_spec_field", "param", "top_field", "document"]))
    if op == "spec_field":
        doc["spec"][data.draw(st.sampled_from(sorted(doc["spec"]) + ["x"]))] = data.draw(json_values)
    elif op == "drop_spec_field":
        doc["spec"].pop(data.draw(st.sampled_from(sorted(doc["spec"]))))
    elif op == "param":
        value = data.draw(json_values)  # drawn first, as the assignment evaluated it
        doc["spec"]["params"][data.draw(st.sampled_from(sorted(doc["spec"]["params"]) + ["y"]))] = value
    elif op == "top_field":
        doc[data.draw(st.sampled_from(["format", "inputs", "spec"]))] = data.draw(json_values)
    else:
        doc = data.draw(json_values)
    run_file(family, "ram_recipe.json", json.dumps(doc))


@SETTINGS
@given(data=st.data())
def test_fuzz_mergekit_configs(family, data):
    """mergekit YAML configs given to `run`: random values in every field, or random YAML altogether."""
    import yaml

    base, agents = family
    doc = {"merge_method": data.draw(st.sampled_from(["ram", "ramplus_tl", "ties", "task_arithmetic", "linear",
                                                      "dare_linear", "dare_ties", "slerp"])),
           "base_model": str(base),
           "models": [{"model": str(a), "parameters": {"weight": 1.0, "density": 0.5}} for a in agents[:2]],
           "parameters": {"lambda": 0.5}}
    op = data.draw(st.sampled_from(["top", "param", "model", "model_param", "text"]))
    if op == "top":
        doc[data.draw(st.sampled_from(["merge_method", "base_model", "models", "parameters", "dtype", "out_dtype",
                                       "tokenizer_source", "slices", "x"]))] = data.draw(json_values)
    elif op == "param":
        doc["parameters"][data.draw(st.sampled_from(["lambda", "normalize", "epsilon", "r", "alpha", "rescale"]))] = \
            data.draw(json_values)
    elif op == "model":
        doc["models"][data.draw(st.integers(0, 1))] = data.draw(json_values)
    elif op == "model_param":
        doc["models"][0]["parameters"][data.draw(st.sampled_from(["weight", "density", "x"]))] = data.draw(json_values)
    text = yaml.safe_dump(doc) if op != "text" else data.draw(st.text(max_size=200))
    run_file(family, "config.yml", text)


# --- Hostile names, nested and aliased documents, fp8 inputs -----------------------------------

HOSTILE = ["![x](http://127.0.0.2:9/b.png)", "[Click to fix](http://127.0.0.2:9/p)", "<img src=x onerror=alert(1)>",
           "\x1b]0;pwned\x07", "\x1b[2J", "=cmd|' /C calc'!A0", "+1+1", "-2", "@SUM(A1)", "\t", "\u202e", "\u2066",
           "%{x}", "$x$", ":red[x]", "\r\n", "`", "*", "_", "www.evil.example", "\x00"]
hostile_text = st.lists(st.sampled_from(HOSTILE) | st.text(max_size=6), min_size=1, max_size=4).map("".join)
TERMINAL_CONTROLS = ("\x1b", "\x07", "\u202e", "\u2066", "\x00", "\r")


def check_printed(*texts: str) -> None:
    """Nothing read from a file reaches the terminal raw: no control or bidi character in what was printed
    (the newline between lines is the only one)."""
    for text in texts:
        assert not any(c in text for c in TERMINAL_CONTROLS), repr(text[:300])


@SETTINGS
@given(data=st.data(), method=methods)
def test_fuzz_hostile_names_in_headers_and_configs(family, data, method):
    """Tensor names and config values with markup, escapes, formulas and bidi characters: the same outcome
    rules, nothing raw on the terminal, CSV cells that never run, inputs untouched."""
    import csv

    from safetensors.torch import load_file, save_file

    with Workspace(family) as ws:
        renames = {}
        first = ws.models[0]
        names = sorted(load_file(sorted(first.glob("*.safetensors"))[0]).keys())
        for name in data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
            renames[name] = data.draw(hostile_text)
        for folder in ws.models:  # the same renames in every model, so the merge itself can still work
            index = folder / "model.safetensors.index.json"
            for shard in folder.glob("*.safetensors"):
                tensors = load_file(shard)
                save_file({renames.get(k, k): v for k, v in tensors.items()}, shard, metadata={"format": "pt"})
            if index.exists():
                doc = json.loads(index.read_text())
                doc["weight_map"] = {renames.get(k, k): v for k, v in doc["weight_map"].items()}
                index.write_text(json.dumps(doc))
        cfg = ws.models[1] / "config.json"
        doc = json.loads(cfg.read_text())
        doc[data.draw(st.sampled_from(["architectures", "model_type", "torch_dtype"]))] = data.draw(hostile_text)
        cfg.write_text(json.dumps(doc))
        before = ws.hashes()
        code, out, err = run_cli("merge", *ws.models, "--method", *method, "--out", ws.out, "--quiet")
        check_outcome(code, err, ws.out)
        check_printed(out, err)
        code, out, err = run_cli("inspect", *ws.models)
        check_outcome(code, err, None)
        check_printed(out, err)
        stats = ws.root / "stats.csv"
        code, out, err = run_cli("analyze", *ws.models, "--csv", stats, "--quiet", "--no-cache")
        check_outcome(code, err, None)
        check_printed(out, err)
        if code == 0:
            for row in csv.reader(stats.read_text().splitlines()):
                assert not any(cell.startswith(("=", "+", "@", "\t", "\r")) or
                               (cell.startswith("-") and not _number(cell)) for cell in row), row
                check_printed(*row)
        assert ws.hashes() == before


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


@SETTINGS
@given(data=st.data())
def test_fuzz_hostile_names_in_recipes(family, recipe, data):
    doc = json.loads(json.dumps(recipe))
    field = data.draw(st.sampled_from(["base", "agents", "out", "method"]))
    value = data.draw(hostile_text)
    doc["spec"][field] = [value, value + "2"] if field == "agents" else value
    base, agents = family
    before = checksums([base, *agents])
    root = Path(tempfile.mkdtemp(prefix="fuzz-run-"))
    try:
        path = root / "ram_recipe.json"
        path.write_text(json.dumps(doc))
        for extra in ([], ["--out", str(root / "out")]):
            code, out, err = run_cli("run", path, "--quiet", *extra)
            check_outcome(code, err, None)
            check_printed(out, err)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert checksums([base, *agents]) == before


@SETTINGS
@given(data=st.data())
def test_fuzz_nested_and_aliased_documents(family, recipe, data):
    """JSON nested to any depth in config.json, an index or a recipe, and YAML nested or aliased: one clear
    outcome, never a RecursionError, never minutes of expansion."""
    depth = data.draw(st.integers(1, 200_000))
    where = data.draw(st.sampled_from(["config", "index", "recipe", "yaml-nested", "yaml-alias"]))
    nested = "[" * depth + "1" + "]" * depth
    if where in ("config", "index"):
        with Workspace(family) as ws:
            target = ws.models[1] / ("config.json" if where == "config" else "model.safetensors.index.json")
            doc = json.loads(target.read_text())
            text = json.dumps(doc)
            target.write_text(text[:-1] + ', "nested": ' + nested + "}")
            merge_and_check(ws, ["ram"])
    elif where == "recipe":
        text = json.dumps(recipe)
        run_file(family, "ram_recipe.json", text[:-1] + ', "nested": ' + nested + "}")
    elif where == "yaml-nested":
        run_file(family, "config.yml", "merge_method: " + "[" * min(depth, 300_000) + "]" * min(depth, 300_000))
    else:
        fan = data.draw(st.integers(2, 12))
        levels = data.draw(st.integers(1, 9))
        text = "a0: &a0 [" + ",".join(['"x"'] * fan) + "]\n" + "".join(
            f"a{i + 1}: &a{i + 1} [" + ",".join([f"*a{i}"] * fan) + "]\n" for i in range(levels))
        run_file(family, "config.yml", text)


@SETTINGS
@given(data=st.data(), method=methods)
def test_fuzz_fp8_inputs(family, data, method):
    """Models stored in F8_E4M3 / F8_E5M2 (merged in their own dtype): a finite, checked model with exit 0, or
    one clear line — never Inf written, never a KeyError."""
    from safetensors.torch import load_file, save_file

    dtype = data.draw(st.sampled_from([torch.float8_e4m3fn, torch.float8_e5m2]))
    scale = data.draw(st.sampled_from([1.0, 100.0, 1e4]))
    with Workspace(family) as ws:
        for folder in ws.models:
            for shard in folder.glob("*.safetensors"):
                tensors = load_file(shard)
                save_file({k: (v.float() * scale).to(dtype) if v.is_floating_point() else v
                           for k, v in tensors.items()}, shard, metadata={"format": "pt"})
        extra = data.draw(st.sampled_from([[], ["--allow-noop"], ["--lambda", "1e6"]]))
        if method[0] in ("ram", "ram_plus") and "--lambda" in extra:
            extra = []
        merge_and_check(ws, method, extra)


@settings(max_examples=_DEEP or 300, deadline=None, derandomize=not _DEEP, database=None)
@given(text=st.lists(st.sampled_from(HOSTILE + ["    ", "  ", "1. ", "# ", "> ", "- ", "---", "&amp;", "&#x41;",
                                             "<!--", "\\", "http://x.y", "a@b.co"]) | st.text(max_size=12),
                     max_size=6).map("".join))
def test_fuzz_markup_escaping_shows_exactly_the_text(text):
    """The app's escaping (app/markup.py), as a property: Markdown parsed from `md(text)` (CommonMark, by
    markdown-it) is one paragraph of plain text that reads exactly `printable(text)` — no link, image, HTML,
    emphasis or code — and holds no raw GFM autolink trigger; `md_code(text)` is exactly one code span of it;
    `plot_text(text)` holds no '<', '%{' or '$' and decodes back to it."""
    import html

    from markdown_it import MarkdownIt

    from app.markup import WORD_JOINER, md, md_code, plot_text
    from merging.common.escaping import printable

    shown = printable(text)
    parser = MarkdownIt("commonmark")
    for source, kind in ((md(text), "text"), (md_code(text), "code_inline")):
        blocks = parser.parse(source)
        if not shown.strip():
            continue
        inline = [t for t in blocks if t.type == "inline"]
        assert len(inline) == 1, (text, source, [t.type for t in blocks])
        children = inline[0].children
        assert {c.type for c in children} <= {kind, "softbreak"} and children, (text, [c.type for c in children])
        rendered = "".join(c.content for c in children).replace(WORD_JOINER, "")
        if kind == "text":
            assert rendered == shown, (text, rendered)
            assert "www." not in source.lower() and "://" not in source, source
        else:
            assert rendered.strip() == shown.strip(), (text, rendered)
    label = plot_text(text)
    assert "<" not in label and "%{" not in label and "$" not in label and html.unescape(label) == shown

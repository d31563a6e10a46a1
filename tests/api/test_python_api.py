"""The Python API (ram_studio.analyze / merge / evaluate / sweep / toy / fig3): docs/python-api.md's examples run as
written; keywords are exactly the CLI's flags; the same checks, errors and files as the CLI; the app's figures;
results that show themselves with every file-derived name escaped; progress through a callback."""
from __future__ import annotations

import hashlib
import html
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ["demo:code", "demo:tool", "demo:memory"]


def doc_blocks(page: str) -> list[str]:
    """The ```python blocks of a docs page, in order."""
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S)


def test_the_python_api_page_runs_as_written(tmp_path):
    """Every example of docs/python-api.md, in order, in an empty folder, in a fresh interpreter (what a reader
    copying them does); the page's own asserts check what they print."""
    script = tmp_path / "examples.py"
    script.write_text("\n\n".join(doc_blocks("python-api.md")))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "merged" / "ram_recipe.json").exists() and (tmp_path / "density.html").exists()
    assert "does not take lambda" in run.stdout and not (tmp_path / "merged2").exists()
    assert "Traceback" not in run.stderr


def test_the_readme_python_lines_run_after_its_cli_lines(tmp_path):
    """The README's Python lines, run where its CLI lines already wrote `merged` (what a newcomer does)."""
    from ram_studio.cli import main

    block = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[0]
    assert main(["merge", "demo:base", *DEMO, "--method", "ram_plus", "--out", str(tmp_path / "merged"),
                 "--quiet"]) == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", block + "\nprint(scores.average)"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert 0 <= float(run.stdout.split()[-1]) <= 100


def _signature_keywords(fn) -> set[str]:
    return {n for n, p in inspect.signature(fn).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


@pytest.mark.parametrize("name", ["analyze", "merge", "evaluate", "sweep"])
def test_keywords_are_the_cli_flags(name):
    """Each function's keywords are its command's options (dest names), plus progress; merge's method parameters
    come as **params and are checked against the methods' declarations."""
    import ram_studio
    from ram_studio.api.options import keyword_actions, subparser

    fn = getattr(ram_studio, name)
    flags = set(keyword_actions(subparser(name, method_flags=False)))
    if name == "merge":
        from merging.methods import all_params

        method = {p.dest for p in all_params().values()}
        assert method <= set(keyword_actions(subparser("merge", method_flags=True)))
        assert inspect.signature(fn).parameters["params"].kind is inspect.Parameter.VAR_KEYWORD
    assert _signature_keywords(fn) == flags | {"progress"}, name


def test_import_is_light_and_help_never_imports_torch():
    code = ("import sys, ram_studio\nfrom ram_studio import analyze, merge, evaluate, sweep, toy, fig3, Progress, "
            "RamStudioError\nprint(sorted(m for m in ('torch', 'pandas', 'numba', 'streamlit') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_merge_writes_what_the_cli_writes(tmp_path):
    """The same inputs and settings through the API and through `ram-studio merge`: byte-identical weights and
    the same recipe spec (the API is the CLI's path, not a second implementation)."""
    from ram_studio import merge
    from ram_studio.cli import main

    api = merge("demo:base", DEMO, method="dare_ta", out=tmp_path / "api", drop_rate=0.3, lambda_=0.9,
                progress=False)
    assert main(["merge", "demo:base", *DEMO, "--method", "dare_ta", "--drop-rate", "0.3", "--lambda", "0.9",
                 "--out", str(tmp_path / "cli"), "--quiet"]) == 0

    def digest(folder: Path) -> str:
        return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()

    assert digest(api.out) == digest(tmp_path / "cli")
    import json

    cli_spec = json.loads((tmp_path / "cli" / "ram_recipe.json").read_text())["spec"]
    assert {k: v for k, v in api.recipe["spec"].items() if k != "out"} == \
        {k: v for k, v in cli_spec.items() if k != "out"}
    assert api.params == {"drop_rate": 0.3, "lambda": 0.9, "seed": 0}


@pytest.mark.parametrize("call,says", [
    (dict(method="ram_plus", lambda_=0.5), "does not take lambda"),
    (dict(method="nope"), "unknown merge method 'nope'"),
    (dict(method="ram", rho_scope="sideways"), "invalid choice: 'sideways'"),
    (dict(method="ties", density=2), "invalid density=2.0"),
    (dict(method="ram", colour="blue"), "unknown keyword 'colour'"),
    (dict(preset="paper", method="ties"), "preset"),
    (dict(method="ram", out_dtype="int8"), "int8"),
])
def test_bad_merge_input_is_one_ramstudioerror_and_writes_nothing(tmp_path, call, says):
    from ram_studio import RamStudioError, merge

    with pytest.raises(RamStudioError) as err:
        merge("demo:base", DEMO[:2], out=tmp_path / "out", progress=False, **call)
    assert says in str(err.value) and "\n" not in str(err.value)
    assert err.value._render_traceback_() == [f"RamStudioError: {err.value}"]  # one line in Jupyter
    assert not (tmp_path / "out").exists()


def test_outputs_follow_the_placement_rules(tmp_path):
    """An output inside an input, or over a folder the tool did not write, is refused before any work."""
    from ram_studio import RamStudioError, analyze, merge

    src = tmp_path / "agent"
    shutil.copytree(ROOT / "assets/demo/models/code", src)
    with pytest.raises(RamStudioError, match="inside|contains"):
        merge("demo:base", [src, "demo:tool"], method="ram", out=src / "merged", progress=False)
    with pytest.raises(RamStudioError, match="inside|contains|is the input"):
        analyze("demo:base", [src, "demo:tool"], json=src / "stats.json", progress=False)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(RamStudioError, match="exists and is not empty"):
        merge("demo:base", DEMO[:2], method="ram", out=tmp_path / "mine", progress=False)
    assert sorted(p.name for p in src.iterdir()) == sorted(p.name for p in (ROOT / "assets/demo/models/code").iterdir())


def test_analysis_tables_files_and_the_apps_figures(tmp_path, monkeypatch):
    import plotly.io as pio

    from ram_studio import Progress, analyze
    from ram_studio.api.figures import charts

    monkeypatch.setattr(pio.templates, "default", "plotly_white")  # the caller's own default, whatever ran before
    seen: list[Progress] = []
    stats = analyze("demo:base", DEMO, eps_ladder=[0, 1e-6, 1e-5], json=tmp_path / "s.json",
                    pairs_csv=tmp_path / "p.csv", progress=seen.append)
    assert seen and {p.stage for p in seen} == {"analyze"} and seen[-1].done == seen[-1].total > 0
    assert stats.ladder == [0.0, 1e-6, 1e-5] and stats.eps == 1e-5
    summary = stats.summary()
    assert list(summary["agent"]) == ["code", "tool", "memory"]
    assert summary["density"].round(3).tolist() == [0.395, 0.099, 0.604]  # the demo README's 39.5 / 9.9 / 60.4 %
    import json

    assert json.loads((tmp_path / "s.json").read_text()) == stats.to_json()
    assert (tmp_path / "p.csv").read_text().startswith("a,b,")
    assert stats.regime() == "chance" and "coincidental" in stats.reading()
    # The same figure the Heterogeneity page draws: the app's builder, titled the app's way.
    from analysis.tables import global_density

    c = charts()
    direct = c.styled(c.density_bars(global_density(stats.result, 1e-5), stats.agents), "Density per agent",
                      c.subtitle_of({"eps": 1e-5, "agents": stats.agents}), kind="light")
    assert stats.density_chart().to_dict() == direct.to_dict()
    assert pio.templates.default == "plotly_white"  # the caller's plotly default is left alone
    dark = stats.pair_chart(theme="dark")
    assert dark.layout.template.layout.font.color == c.THEMES["dark"]["ink"]
    lam = stats.lambdas(r=0.1, alpha=2.0)
    assert lam.set_index("agent")["lambda"].round(4).to_dict() == {"code": 1.2, "tool": 1.2, "memory": 1.1306}


def test_results_show_themselves_with_names_escaped(tmp_path):
    """A folder named like markup is shown as text in the HTML and Markdown reprs, never as markup."""
    from ram_studio import analyze

    evil = tmp_path / "<img src=x onerror=alert(1)>"
    shutil.copytree(ROOT / "assets/demo/models/tool", evil)
    stats = analyze("demo:base", ["demo:code", evil], progress=False)
    page = stats._repr_html_()
    assert "<img" not in page and html.escape("<img src=x onerror=alert(1)>") in page
    assert "<table>" in page and "same sign" in page
    md = stats._repr_markdown_()
    assert re.search(r"(?<!\\)<img", md) is None and "\\<img" in md
    assert "agent" in str(stats) and repr(stats).startswith("<Analysis: Analysis of 2 agents")


def test_evaluate_and_its_json_match_the_cli(tmp_path):
    from ram_studio import RamStudioError, evaluate
    from ram_studio.cli import main

    scores = evaluate("demo:tool", tasks=["tool"], split="validation", limit=12, json=tmp_path / "e.json",
                      progress=False)
    assert list(scores.scores) == ["tool"] and scores.n == {"tool": 12} and 0 <= scores.average <= 100
    assert main(["evaluate", "demo:tool", "--tasks", "tool", "--split", "validation", "--limit", "12", "--quiet",
                 "--json", str(tmp_path / "cli.json")]) == 0
    import json

    api_doc, cli_doc = (json.loads((tmp_path / f).read_text()) for f in ("e.json", "cli.json"))
    assert {k: v for k, v in api_doc.items() if k != "seconds"} == {k: v for k, v in cli_doc.items() if k != "seconds"}
    assert list(scores.table().columns)[:3] == ["task", "n", "accuracy %"]
    with pytest.raises(RamStudioError, match="no x split"):
        evaluate("demo:tool", split="x", progress=False)
    with pytest.raises(RamStudioError, match="exclude each other"):
        evaluate("demo:tool", tasks="tool", lm_eval="ram_demo_tool", progress=False)


def test_sweep_chooses_on_validation_and_resumes(tmp_path):
    from ram_studio import sweep

    first = sweep("demo:base", DEMO, try_={"method": "ram_plus", "r": [0, 0.2]}, limit=6, no_references=True,
                  csv=tmp_path / "s.csv", progress=False)
    table = first.table()
    assert set(table["split"]) == {"validation", "test"} and len(first.chosen()) == 1
    assert first.best in {"ram_plus r=0.0", "ram_plus r=0.2"} and first.selected == {"ram_plus": first.best}
    assert (tmp_path / "s.csv").exists() and first.to_json()["best"] == first.best
    again = sweep("demo:base", DEMO, try_="ram_plus r=0,0.2", limit=6, no_references=True, progress=False)
    assert all(e.resumed for e in again.result.entries) and again.best == first.best
    assert len(again.parameter_chart("ram_plus", "r").data) >= 2 and again.time_chart().data


def test_toy_matches_the_signal_dilution_page():
    from ram_studio import RamStudioError, toy

    t = toy([0.1, 0.4, 0.5], [0.6, 0.4, 0.3], r=0.1, alpha=2.0)
    kept = t.retention().pivot(index="agent", columns="method", values="retention")
    assert kept["average"].round(4).eq(round(1 / 3, 4)).all() and kept["RAM"].eq(1.0).all()
    assert (kept["RAM+"] >= 1.0).all() and len(t.heatmaps().data) == 6
    with pytest.raises(RamStudioError, match="2 to 5 agents"):
        toy([0.1], [0.5])

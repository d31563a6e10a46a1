"""The README's commands are the ones CI runs, and the documented CLI (docs/cli.md) matches the real parser."""
from pathlib import Path

from merging.methods import METHODS
from ram_studio.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = text.split("```bash\n")[1:3]
    return [b.split("\n```", 1)[0].strip() for b in blocks]


def test_ci_runs_the_readme_test_command():
    install_run, test = readme_commands()
    assert "streamlit run app/main.py" in install_run and "pip install torch==2.13.0" in install_run
    assert "python -m pytest" in test
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test in ci_lines


def test_docs_list_every_method_and_subcommand():
    readme, methods = (ROOT / "README.md").read_text(), (ROOT / "docs" / "methods.md").read_text()
    text = (ROOT / "docs" / "cli.md").read_text()
    for name in METHODS:
        assert f"`{name}`" in readme and f"`{name}`" in methods, name
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for command in sub.choices:
        assert f"ram-studio {command}" in text, command
    from merging.methods import all_params

    for param in all_params().values():
        assert param.flag in text, param.flag  # every generated method flag is documented
    import argparse

    full = next(a for a in build_parser(True)._actions if isinstance(a, argparse._SubParsersAction))
    for command, parser in full.choices.items():  # and every flag --help lists, of every command
        for action in parser._actions:
            if action.help != argparse.SUPPRESS:
                assert all(f in text for f in action.option_strings if f.startswith("--") and f != "--help"), \
                    (command, action.option_strings)

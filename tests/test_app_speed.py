"""The app's server settings that keep its background jobs as fast as the CLI's."""
from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_the_server_runs_no_full_garbage_collection_after_each_script_run():
    """While a job runs, its page polls it every 0.5 s; Streamlit's default `runner.postScriptGC` then runs
    gc.collect(2) after every poll, holding the GIL the merge's threads need (measured: a merge 1.7-1.9 x
    slower in the server than the same job in a plain process). The repository's config, read by
    `streamlit run app/main.py` from the checkout, turns it off with an option Streamlit still knows."""
    from streamlit import config

    settings = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert settings["runner"]["postScriptGC"] is False
    option = config._config_options_template["runner.postScriptGC"]
    assert option.type is bool and option.default_val is True  # still Streamlit's default: the setting matters

"""An exception inside an lm-eval task — its `process_results` raising, a data file missing — reaches the user as one
line naming the task and what failed (exit 2), never as lm-eval's traceback. The task folders are copies of the
demo's, broken on purpose (an --include-path folder's Python runs by lm-eval's design: these are our own)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

ROOT = Path(__file__).resolve().parents[2]
TASKS_DIR = ROOT / "assets" / "demo" / "lm_eval_tasks"


@pytest.mark.parametrize("broken,fragment", [
    ("process_results", "failed while scoring in process_results (utils.py, line"),
    ("missing-data", "failed while loading"),
])
def test_a_failing_task_is_one_line_naming_it(tmp_path, broken, fragment):
    tasks = shutil.copytree(TASKS_DIR, tmp_path / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    if broken == "process_results":
        with open(tasks / "utils.py", "a") as f:
            f.write("\n\ndef process_results(doc, results):\n    raise ValueError('this metric is broken')\n")
    else:
        (tasks / "data" / "code_test.jsonl").unlink()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets")}
    proc = subprocess.run([sys.executable, "-m", "ram_studio", "evaluate", "demo:base", "--lm-eval", "ram_demo_code",
                           "--include-path", str(tasks), "--limit", "2", "--quiet"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    err = proc.stderr
    assert proc.returncode == 2 and err.count("\n") == 1 and err.startswith("error: "), err[-3000:]
    assert "Traceback" not in err and "lm-eval task ram_demo_code" in err and fragment in err, err
    assert ("this metric is broken" in err) if broken == "process_results" else ("code_test.jsonl" in err), err

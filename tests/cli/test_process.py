"""The command's process: OpenMP's wait policy is set where a command starts (never on import), and the process
exits by the interpreter's own means — promptly with background threads still running, at once on Ctrl-C or
SIGTERM while the interpreter waits for a thread, never with a traceback."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def python(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env={**environ, **env}, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("given,want", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_a_command_sets_the_openmp_wait_policy_where_it_starts(given, want):
    """Importing the CLI sets nothing; running a command (or the Python API's first use) sets PASSIVE unless the user
    chose a policy."""
    code = ("import json, os\nimport ram_studio, ram_studio.cli\nseen = [os.environ.get('OMP_WAIT_POLICY')]\n"
            "assert ram_studio.cli.main(['tasks']) == 0\nseen.append(os.environ.get('OMP_WAIT_POLICY'))\n"
            "print(json.dumps(seen))")
    done = python(code, **({} if given is None else {"OMP_WAIT_POLICY": given}))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [given, want]
    api = python("import os, ram_studio\nbefore = os.environ.get('OMP_WAIT_POLICY')\nram_studio.RamStudioError\n"
                 "print(before, os.environ.get('OMP_WAIT_POLICY'))")
    assert api.returncode == 0 and api.stdout.split() == ["None", "PASSIVE"], api.stderr[-2000:]


# The CLI's process entry point with work left behind: a daemon thread that never ends, an executor nobody shut down,
# the kernels compiling (into an empty cache) and, with argv[1] == "stuck", a non-daemon thread that never ends.
LEFT_BEHIND = '''import concurrent.futures, sys, threading, time
import merging.kernels as kernels
from ram_studio import cli
threading.Thread(target=lambda: [time.sleep(0.01) for _ in iter(int, 1)], daemon=True).start()
concurrent.futures.ThreadPoolExecutor(1).submit(int)
kernels.prepare(wait=False)
if sys.argv[1] == "stuck":
    threading.Thread(target=threading.Event().wait, name="stuck").start()
sys.argv = ["ram-studio", "inspect", "/nonexistent/base", "/nonexistent/agent"]
cli.run()
'''


def test_the_process_ends_with_background_threads_still_running(tmp_path):
    """Daemon threads (one busy, the kernels' compiler in the middle of its work) and an idle executor do not hold
    the exit: the command's one error line, exit status 2, no traceback."""
    done = python(LEFT_BEHIND, "daemons", NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("error: model path") and "Traceback" not in done.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_while_the_interpreter_waits_for_a_thread_ends_the_process(signum, tmp_path):
    """A thread that never ends keeps the interpreter waiting at exit; Ctrl-C (or SIGTERM) then ends the process at
    once, by the signal's default action — what the command said has already arrived, and no traceback follows."""
    proc = subprocess.Popen([sys.executable, "-c", LEFT_BEHIND, "stuck"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")})
    try:
        first = proc.stderr.readline()  # the command's error line: main has returned, the exit has begun
        assert first.startswith("error: model path"), first
        time.sleep(1.0)  # the interpreter is now joining the stuck thread
        assert proc.poll() is None, "the process should wait for its non-daemon thread"
        proc.send_signal(signum)
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) == -signum
        assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

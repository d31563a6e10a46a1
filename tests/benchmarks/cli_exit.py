"""What the CLI's exit costs: one command run to its end three ways, interleaved on one machine.

    python -m tests.benchmarks.cli_exit [--runs 8] [--out FILE] [-- COMMAND ARGS...]

Default command: `analyze demo:base demo:code demo:tool demo:memory --no-cache --quiet` (torch, numba and pandas
loaded, as in every real command). The three exits:
- `run`: `ram_studio.cli.run`, what `ram-studio` does — flush, signals to their default action, `gc.freeze()`,
  then `sys.exit` (the interpreter's own teardown);
- `sys.exit`: `sys.exit(main())` — the interpreter's teardown with its garbage collections;
- `no-teardown`: `main()`, flush, then `os._exit` — no teardown at all (the floor; what the CLI did before it
  gave up private interpreter calls).
Reports the medians of wall time and of user + system CPU (os.wait4) per exit, and every run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ["analyze", "demo:base", "demo:code", "demo:tool", "demo:memory", "--no-cache", "--quiet"]
DRIVERS = {
    "run": "import sys\nfrom ram_studio import cli\nsys.argv = ['ram-studio', *sys.argv[1:]]\ncli.run()\n",
    "sys.exit": "import sys\nfrom ram_studio.cli import main\nsys.exit(main(sys.argv[1:]))\n",
    "no-teardown": "import os, sys\nfrom ram_studio.cli import main\ncode = main(sys.argv[1:])\n"
                   "sys.stdout.flush(); sys.stderr.flush()\nos._exit(code)\n",
}


def once(driver: str, command: list[str], cache: Path) -> dict:
    """One run: wall seconds and user + system CPU seconds of the process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAM_STUDIO_CACHE": str(cache)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", driver, *command], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the command failed: {err[-2000:]}")
    return {"wall_s": round(wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("command", nargs="*", default=DEFAULT)
    args = ap.parse_args(argv)
    command = args.command or DEFAULT
    runs: dict[str, list[dict]] = {name: [] for name in DRIVERS}
    with tempfile.TemporaryDirectory() as tmp:
        once(DRIVERS["run"], command, Path(tmp) / "warm")  # kernels compiled and the page cache warm first
        for i in range(args.runs):
            for name, driver in DRIVERS.items():
                runs[name].append(once(driver, command, Path(tmp) / f"{name}-{i}"))
    summary = {name: {"median_wall_s": statistics.median(r["wall_s"] for r in rs),
                      "median_cpu_s": statistics.median(r["cpu_s"] for r in rs)} for name, rs in runs.items()}
    doc = {"command": ["ram-studio", *command], "runs_each": args.runs, "summary": summary, "runs": runs,
           "python": sys.version.split()[0], "cpus": os.cpu_count()}
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    for name, s in summary.items():
        print(f"{name:12s} wall {s['median_wall_s']:.2f} s   cpu {s['median_cpu_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

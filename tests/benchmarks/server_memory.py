"""The server's memory with and without its limits, side by side: the soak of tests/browser/test_server_memory.py
(one real server, headless chromium, distinct model sets analysed and merges run) once with small limits and once
with limits too large to drop anything; the server's resident memory after every set, and what it kept.

    python -m tests.benchmarks.server_memory [--sets 14] [--merges 4] [--per-set 16] [--limit 8MB] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from tests.browser.test_server_memory import MB, kept, soak


def run(limit: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="ram-soak-") as tmp:
        t0 = time.time()
        result = soak(Path(tmp), limit, args.job_limit if limit != "10GB" else "10GB", args.sets, args.merges,
                      args.per_set)
    samples = result["samples"]
    warm = samples[args.warm_up][1]
    return {"analysis_limit": limit, "seconds": round(time.time() - t0), "load": os.getloadavg(),
            "rss_mb": {name: round(rss / MB, 1) for name, rss in samples},
            "growth_after_warm_up_mb": round((max(r for _, r in samples[args.warm_up:]) - warm) / MB, 1),
            "kept_analyses": kept(result["log"], "(?:analysis|analyses)")[-1:],
            "kept_job_records": kept(result["log"], "job records?")[-1:], "timing_s": result["timing"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", type=int, default=14)
    p.add_argument("--merges", type=int, default=4)
    p.add_argument("--per-set", type=int, default=16)
    p.add_argument("--warm-up", type=int, default=4)
    p.add_argument("--limit", default="8MB")
    p.add_argument("--job-limit", default="50KB")
    p.add_argument("--out")
    args = p.parse_args()
    report = [run(args.limit, args), run("10GB", args)]
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

"""The paper's Fig. 3 on the demo: keep only one agent's *unique* region, whole or divided by N.

For each agent a, two merges go through the core CLI: `--method unique_only --agent a` (the base
plus τ_a where no other agent changed the element, ε = 1e-5) and the same with `--dilute` (that
update divided by N = 3, which is what averaging does to a unique element). Both are scored
greedily on every task, validation and test, next to the base and the full agents (rows of
their own). Whatever it shows is the direct measurement of signal
dilution on these agents.

    python -m assets.demo.fig3 [--models assets/demo/models] [--out assets/demo/results]

Writes `fig3.csv` (tidy: agent, variant, task, subset, split, n, correct, accuracy; variant is
`base`, `unique`, `unique_div_N` or `agent`) and `fig3.md`.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from .evaluate import evaluate_model
from .table1 import AGENTS, DEMO_DIR, RAM_DEFAULTS
from .tasks import TASKS

REPO_ROOT = DEMO_DIR.parent.parent

SPLITS = ("validation", "test")
VARIANTS = {"unique": False, "unique_div_N": True}
# The tidy schema the app's Signal-dilution page reads (analysis/fig3.py): base rows leave `agent` empty.
COLUMNS = ["agent", "variant", "task", "subset", "split", "n", "correct", "accuracy"]


# Rough throughputs for the app's estimate of the experiment on selected models. Reading and writing weights:
# the Models page's disk assumption. Scoring: the demo evaluator's greedy decoding costs about this many seconds
# per model parameter and example, measured here on the demo (0.33 M parameters, 300 test examples per task:
# 0.6-1.4 s per task on a 2-core CPU, model loading included, other jobs running); and each merge has a fixed
# cost (opening the models, writing and loading the folder: 0.2-0.8 s on the demo, measured the same way).
READ_BPS = 400e6
EVAL_SECONDS_PER_PARAM_EXAMPLE = 1e-8
STEP_SECONDS = 0.5


def estimate_seconds(n_agents: int, params: int, bytes_per_model: int, examples_per_merge: list[int],
                     examples_of_references: int = 0) -> float:
    """The Fig. 3 job's duration from the models' size: 2·N unique_only merges (each reads the base and every
    agent and writes one model), each scored on `examples_per_merge` examples (its agent's own task), plus the
    base and the agents when their scores are not at hand."""
    merges = 2 * n_agents * ((n_agents + 2) * bytes_per_model / READ_BPS + STEP_SECONDS)
    scoring = (2 * sum(examples_per_merge) + examples_of_references) * params * EVAL_SECONDS_PER_PARAM_EXAMPLE
    return merges + scoring


def merge(models: Path, method: str, out: Path, params: dict[str, object]) -> None:
    """Run the core CLI merge of base + the three agents into `out` (`dilute: True` becomes the bare
    `--dilute` flag)."""
    cmd = [sys.executable, "-m", "merging", "merge", str(models / "base"), *[str(models / a) for a in AGENTS],
           "--method", method, "--out", str(out), "--overwrite", "--quiet"]
    for key, value in params.items():
        if key == "dilute":
            cmd += ["--dilute"] if value else []
        else:
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"merge failed ({' '.join(cmd)}):\n{proc.stdout}\n{proc.stderr}")


def _scores(folder: Path, split: str, limit: int | None) -> pd.DataFrame:
    return evaluate_model(folder, TASKS, split, limit)[["task", "subset", "n", "correct", "accuracy"]]


def run(models: Path, out_dir: Path, limit: int | None = None) -> pd.DataFrame:
    """Merge, score and write `fig3.csv` / `fig3.md`; returns the tidy frame."""
    t0 = time.time()
    frames = []
    for split in SPLITS:
        frames.append(_scores(models / "base", split, limit).assign(agent="", variant="base", split=split))
        for agent in AGENTS:
            frames.append(_scores(models / agent, split, limit).assign(agent=agent, variant="agent",
                                                                        split=split))
    with tempfile.TemporaryDirectory(prefix="fig3-") as tmp:
        for agent in AGENTS:
            for variant, dilute in VARIANTS.items():
                out = Path(tmp) / f"{agent}-{variant}"
                merge(models, "unique_only", out, {"eps": RAM_DEFAULTS["eps"], "agent": agent,
                                                   "dilute": dilute})
                for split in SPLITS:
                    frames.append(_scores(out, split, limit).assign(agent=agent, variant=variant,
                                                                    split=split))
                print(f"  {agent} {variant}: done", flush=True)
    tidy = pd.concat(frames, ignore_index=True)[COLUMNS]
    out_dir.mkdir(parents=True, exist_ok=True)
    tidy.to_csv(out_dir / "fig3.csv", index=False)
    (out_dir / "fig3.md").write_text(markdown(tidy, "test") + "\n")
    print(markdown(tidy, "test"))
    print(f"[fig3] done in {time.time() - t0:.0f} s")
    return tidy


def markdown(tidy: pd.DataFrame, split: str = "test") -> str:
    """Per agent: accuracy (%) on each task of the base, the unique region alone, the unique
    region divided by N, and the full agent; own-task gains relative to the base."""
    t = tidy[(tidy.split == split) & (tidy.subset == "all")]
    base = t[t.variant == "base"].set_index("task")["accuracy"]
    lines = [f"Fig. 3 on the demo ({split} split, accuracy %): base + one agent's unique region "
             "(ε = 1e-5), whole or divided by N = 3", "",
             "| unique region of | model | " + " | ".join(TASKS) + " | own-task gain vs base |",
             "|---|---|" + "---|" * len(TASKS) + "---|"]
    for agent in AGENTS:
        mine = t[t.agent == agent]
        rows = [("base", base), ("unique only", mine[mine.variant == "unique"].set_index("task")["accuracy"]),
                ("unique / N", mine[mine.variant == "unique_div_N"].set_index("task")["accuracy"]),
                (f"full {agent} agent", mine[mine.variant == "agent"].set_index("task")["accuracy"])]
        for label, series in rows:
            cells = " | ".join(f"{100 * series.loc[task]:.2f}" for task in TASKS)
            gain = 100 * (series.loc[agent] - base.loc[agent])
            lines.append(f"| {agent} | {label} | {cells} | {gain:+.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assets.demo.fig3",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=DEMO_DIR / "models")
    parser.add_argument("--out", type=Path, default=DEMO_DIR / "results")
    parser.add_argument("--limit", type=int, default=None, help="examples per task and split")
    args = parser.parse_args(argv)
    run(args.models.resolve(), args.out.resolve(), args.limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())

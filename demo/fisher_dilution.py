"""How much Fisher merging dilutes each demo agent's unique updates (the RAM paper's App. D): the effective scale
F_t / Σ_i F_i on the elements only agent t changed, next to the shared elements, for a trio's Fishers.

    python -m demo.fisher_dilution [--models assets/demo/models] [--out assets/demo/results]
        [--examples 2048] [--rule sampled]

Each agent's Fisher comes from the analysis cache (computed when missing, on its own task's train split, as a
merge computes it); writes OUT/fisher_dilution.csv and prints it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import torch

from .table1 import AGENTS, DEMO_DIR, trio_name


def measure(models: Path, n: int, rule: str, floor: float = 1e-6, eps: float = 1e-5):
    """The effective-scale table of one trio (analysis.fisher_scale), its Fishers from the cache or computed."""
    from analysis.fisher_scale import effective_scales
    from evaluation.fisher import FisherPlan, agent_prints, ensure_fishers, resolve_tasks
    from merging.reading.checkpoint import open_checkpoint
    from merging.reading.side_tensors import open_side_file

    from .evaluate import suite_of_folder
    from .evaluator import DemoEvaluator

    base = open_checkpoint(models / "base")
    agents = [open_checkpoint(models / a) for a in AGENTS]
    ev = DemoEvaluator(suite=suite_of_folder(models / "base"))
    plan = FisherPlan(resolve_tasks([a.label for a in agents], ev.tasks, None), rule, (n,))
    found = ensure_fishers(ev, base, agents, agent_prints(agents), plan, device=torch.device("cpu"))
    fishers = [open_side_file(f[n].path, "fisher") for f in found]
    table = effective_scales(base, agents, fishers, eps=eps, floor=floor)
    table.insert(0, "trio", trio_name(models))
    table.insert(1, "n", n)
    table.insert(2, "rule", rule)
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m demo.fisher_dilution", description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=DEMO_DIR / "models")
    parser.add_argument("--out", type=Path, default=DEMO_DIR / "results")
    parser.add_argument("--examples", type=int, default=2048)
    parser.add_argument("--rule", default="sampled", choices=["sampled", "greedy", "reference"])
    args = parser.parse_args(argv)
    table = measure(args.models.resolve(), args.examples, args.rule)
    args.out.mkdir(parents=True, exist_ok=True)
    table.round(4).to_csv(args.out / "fisher_dilution.csv", index=False)
    print(table.round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

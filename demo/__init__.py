"""The bundled RAM demo's code: a tiny Qwen2 base and three RL-trained agents, toy agentic tasks, their build,
evaluation and the paper's experiments on them. Its data — the models, results, sweep grids and lm-eval task
files — lives under `assets/demo/` (DATA_DIR), next to this package in a checkout and in an installed wheel."""
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "assets" / "demo"

"""The demo's tasks as lm-evaluation-harness task definitions: `make_data.py` writes them — YAML files and their
data — into `assets/demo/lm_eval_tasks/` (data in its `data/`), so that lm-eval's own CLI scores any demo model:
`lm_eval --model hf --model_args pretrained=DIR,dtype=float32 --tasks ram_demo_tool --include_path
assets/demo/lm_eval_tasks`. `assets/demo/lm_eval_tasks/utils.py`, beside the YAML files that name it, loads the
data and scores with the demo's verifiers. The files come from the task declarations in `demo/tasks/` (never edit
them by hand: `make_data.py --check`, run by the tests, says when they are stale)."""

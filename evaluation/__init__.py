"""Scoring models and choosing merges by their scores: evaluators (the demo's tasks, lm-evaluation-harness),
in-memory merge candidates and sweeps.

Layer: above `analysis` and `merging` (a sweep reuses the analysis counts and the merge methods), below
`demo` (the demo's evaluator implements `evaluation.base.Evaluator`) and the app and the CLI.
"""

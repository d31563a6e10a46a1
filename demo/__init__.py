"""Bundled RAM demo: tiny Qwen2 base + three RL-trained agents, toy agentic tasks, evaluation."""

"""The Merge page's Fisher data: whose tasks feed each agent's Fisher (the demo's or lm-evaluation-harness's), and
the merge job that first runs the Fisher pass (evaluation.fisher: from the cache when it has them) and then the
merge with them. The Sweep page's Fisher candidates compute theirs inside the sweep."""
from __future__ import annotations

import time
from dataclasses import dataclass

import streamlit as st

from app import state
from app.markup import md
from merging.common.errors import RamStudioError

SOURCES = ("Demo tasks", "lm-evaluation-harness")


@dataclass(frozen=True)
class FisherChoice:
    """The data the Fisher pass reads: demo tasks (of the base's suite) or lm-eval tasks (with an include path), and
    each agent's task (None: the task named like the agent)."""

    lm_eval: bool
    tasks: tuple[str, ...] | None
    include_path: str = ""

    def evaluator(self, base_folder):
        """The evaluator that gives the Fisher pass its data and loads the agents."""
        if self.lm_eval:
            from evaluation.lm_eval_backend import LmEvalEvaluator

            return LmEvalEvaluator(list(self.tasks or ()), self.include_path or None, backend="hf")
        from demo.evaluate import suite_of_folder
        from demo.evaluator import DemoEvaluator

        return DemoEvaluator(suite=suite_of_folder(base_folder))


def fisher_widgets(sel: state.Selection, disabled: bool) -> FisherChoice:
    """Where each agent's Fisher comes from (drawn under the method's parameters when the method is fisher)."""
    st.markdown("**Fisher data** — each agent's diagonal Fisher is computed on its own task (its train split), "
                "once, and kept in the analysis cache.")
    c = st.columns([2, 3])
    kind = c[0].radio("Tasks", SOURCES, index=0 if sel.is_demo else 1, horizontal=True, key="fisher_source",
                      disabled=disabled, help="The demo's tasks fit models built from the demo base; lm-evaluation-"
                                              "harness tasks fit any causal LM (a task with a training split).")
    lm_eval = kind == SOURCES[1]
    include = c[1].text_input("Include path (lm-eval, optional)", key="fisher_include",
                              disabled=disabled or not lm_eval,
                              placeholder="a folder of task YAML files, e.g. assets/demo/lm_eval_tasks")
    text = st.text_input("Each agent's own task, in the agents' order (comma-separated)", key="fisher_tasks",
                         disabled=disabled,
                         placeholder="empty: the task named like each agent (code → code, or ram_demo_code)",
                         help="One task per agent: " + ", ".join(md(a) for a in sel.agents))
    tasks = tuple(t.strip() for t in text.split(",") if t.strip()) or None
    if lm_eval and not tasks:
        st.caption("Name each agent's lm-eval task (e.g. ram_demo_code,ram_demo_tool,ram_demo_memory).")
    return FisherChoice(lm_eval, tasks, include.strip())


def fisher_runner(choice: FisherChoice):
    """A merge job's runner (app.jobs submit's `runner`): the Fisher pass (its progress as phase `fisher`, in
    examples), then the merge with each agent's Fisher."""
    def run(spec, *, progress=None, cancel=None, **options):
        from evaluation.fisher import merge_side
        from merging.merge import merge_to_folder
        from merging.passes import Progress
        from merging.reading.refs import resolve

        t0 = time.perf_counter()

        def step(done: int, total: int, text: str) -> None:
            if progress is not None:
                progress(Progress("fisher", done, total, 0, 0, text, time.perf_counter() - t0))

        if choice.lm_eval and not choice.tasks:
            raise RamStudioError("no lm-eval task named for the Fisher.", "Name each agent's own task.")
        evaluator = choice.evaluator(resolve(spec.base, download=False))
        side = merge_side(spec, evaluator, choice.tasks, progress=step, cancel=cancel)
        return merge_to_folder(spec, progress=progress, cancel=cancel, side=side, **options)

    return run

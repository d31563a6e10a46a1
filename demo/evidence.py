"""Scores of the same models for the overlap reading (`demo.table1.evidence_for`), looked up without
importing the evaluation stack (transformers: seconds of start-up) unless the models are a demo trio."""
from __future__ import annotations


def evidence_for(base: str, agents: list[str]) -> str:
    """The committed Table 1's sentence when `base` and `agents` are a demo trio's references, else ""."""
    from merging.reading.refs import demo_prefix

    if demo_prefix(base) is None:
        return ""
    from .table1 import evidence_for as from_table1

    return from_table1(base, agents)

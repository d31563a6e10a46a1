"""The server's memory bounds (app/memory.py): bytes measured from what a value holds, least recently used dropped
first, the limits read from their settings, and the analysis store (app/state.py) saying when it recomputes an
analysis it dropped."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st
import torch

from app.memory import (
    ANALYSIS_ENV,
    DEFAULT_ANALYSIS_BYTES,
    LRUStore,
    limit_from_env,
    measure_bytes,
)
from tests.app_helpers import new_app, no_problems, plain

MB = 1_000_000


@dataclass
class Holder:
    frame: pd.DataFrame
    arrays: list


def test_measured_bytes_are_those_of_the_frames_and_arrays_held():
    frame = pd.DataFrame({"x": np.zeros(100_000), "name": [f"tensor.{i % 50}" for i in range(100_000)]})
    array, tensor = np.zeros(250_000), torch.zeros(125_000, dtype=torch.float64)
    assert measure_bytes(frame) == int(frame.memory_usage(deep=True).sum())
    assert measure_bytes(array) == 2 * MB and measure_bytes(tensor) == MB
    assert measure_bytes(array[10:]) >= 2 * MB  # a view holds its base's memory
    nested = Holder(frame, [array, {"t": tensor, "again": array}])  # the same array twice is held once
    expected = measure_bytes(frame) + 3 * MB
    assert expected <= measure_bytes(nested) < expected + 10_000


def test_measuring_a_huge_structure_is_bounded():
    """A result with millions of small objects is estimated from a bounded walk, never a hang."""
    many = [[i] for i in range(1_000_000)]
    assert 0 < measure_bytes(many) < 200 * MB


def test_the_store_keeps_the_most_recently_used_within_its_limit():
    log, dropped = [], []
    store = LRUStore(3 * MB, "analysis", log=log.append, on_drop=lambda k, v, n: dropped.append((k, n)),
                     plural="analyses")
    for name in "abc":
        store.put(name, np.zeros(MB // 8))  # 1 MB each
    assert len(store) == 3 and store.bytes == 3 * MB
    assert store.get("a") is not None  # "a" is now the most recently used: "b" goes first
    store.put("d", np.zeros(MB // 8))
    assert "b" not in store and {"a", "c", "d"} <= {k for k in "acd" if k in store}
    assert store.was_dropped("b") and not store.was_dropped("a") and dropped == [("b", MB)]
    assert store.bytes <= store.limit and len(log) == 1 and "'b'" in log[0] and "3 analyses kept" in log[0]
    store.put("b", np.zeros(MB // 8))  # stored again: no longer "dropped"
    assert not store.was_dropped("b")
    assert store.pop("b") is not None and not store.was_dropped("b")  # removed on purpose: not "dropped"


def test_the_value_stored_last_stays_even_alone_over_the_limit():
    store = LRUStore(MB, "job record", log=lambda line: None)
    store.put("small", np.zeros(1000))
    store.put("big", np.zeros(MB))  # 8 MB: the page that asked for it is using it
    assert "big" in store and "small" not in store and store.bytes == 8 * MB
    store.put("next", np.zeros(1000))
    assert "big" not in store and store.bytes <= store.limit


def test_a_dropped_value_is_freed_at_once_even_inside_reference_cycles(monkeypatch):
    """Charts and frames made from an analysis refer to each other in cycles, which Python's collector reaches
    only after many more allocations: a drop collects them then (and trims glibc's heap), so the server's
    resident size falls when it drops, not some time later."""
    import gc
    import weakref

    from app import memory

    monkeypatch.setattr(memory, "_LAST_AT", -memory.COLLECT_GAP_S)  # no collection ran just before this test
    monkeypatch.setattr(memory, "_NEXT_AT", None)

    class Node:
        pass

    store = LRUStore(MB, "analysis", log=lambda line: None)
    cyclic = Node()
    cyclic.data, cyclic.me = np.zeros(MB // 8), cyclic  # 1 MB held in a cycle
    alive = weakref.ref(cyclic)
    gc.disable()  # no automatic collection can run in between: only the drop's own
    try:
        store.put("old", cyclic)
        del cyclic
        assert alive() is not None  # the store holds it
        store.put("new", np.zeros(MB // 8))
        assert "old" not in store and alive() is None
    finally:
        gc.enable()


def test_drops_in_quick_succession_share_one_later_collection(monkeypatch):
    """A full collection costs most of a second in a large process: a second drop right after one is collected
    by one more collection at the end of the gap (not at once, and not once per drop), and is freed then."""
    import gc
    import time
    import weakref

    from app import memory

    class Node:
        pass

    def cyclic():
        node = Node()
        node.data, node.me = np.zeros(MB // 8), node
        return node

    monkeypatch.setattr(memory, "_LAST_AT", -memory.COLLECT_GAP_S)
    monkeypatch.setattr(memory, "_NEXT_AT", None)
    store = LRUStore(MB, "analysis", log=lambda line: None)
    alive = []
    gc.disable()
    try:
        for name in ("first", "second"):  # the second drops the first: collected at once
            value = cyclic()
            alive.append(weakref.ref(value))
            store.put(name, value)
            del value
        assert alive[0]() is None and alive[1]() is not None
        store.put("third", np.zeros(MB // 8))  # drops the second, within the gap: collected at its end
        assert alive[1]() is not None
        deadline = time.monotonic() + memory.COLLECT_GAP_S + 10
        while alive[1]() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive[1]() is None
    finally:
        gc.enable()


def test_the_limit_comes_from_its_setting(monkeypatch):
    lines = []
    monkeypatch.delenv(ANALYSIS_ENV, raising=False)
    assert limit_from_env(ANALYSIS_ENV, DEFAULT_ANALYSIS_BYTES) == DEFAULT_ANALYSIS_BYTES
    monkeypatch.setenv(ANALYSIS_ENV, "2GiB")
    assert limit_from_env(ANALYSIS_ENV, DEFAULT_ANALYSIS_BYTES) == 2 * 1024 ** 3
    monkeypatch.setenv(ANALYSIS_ENV, "500MB")
    assert limit_from_env(ANALYSIS_ENV, DEFAULT_ANALYSIS_BYTES) == 500 * MB
    for bad in ("lots", "-1GB", "0", "1e3\x1b[2J"):
        monkeypatch.setenv(ANALYSIS_ENV, bad)
        assert limit_from_env(ANALYSIS_ENV, DEFAULT_ANALYSIS_BYTES, lines.append) == DEFAULT_ANALYSIS_BYTES
    assert len(lines) == 4 and all(ANALYSIS_ENV in line and "using the default 1.00 GB" in line for line in lines)
    assert not any("\x1b" in line for line in lines)  # the value is shown escaped in the server's log


def demo_url(at, agents: list[str]):
    at.query_params["base"] = "demo:base"
    at.query_params["agent"] = agents
    return at


def test_an_analysis_dropped_from_memory_is_recomputed_with_a_note(env, monkeypatch):
    """With a limit below one analysis, each new selection drops the previous one; opening that one again says
    why it is computed again, then shows the page as before (from the analysis cache on disk)."""
    from app import state

    monkeypatch.setenv(ANALYSIS_ENV, "1KB")
    st.cache_resource.clear()  # a new server: the store reads its limit when it is created
    try:
        trio, pair = ["demo:code", "demo:tool", "demo:memory"], ["demo:code", "demo:tool"]
        first = demo_url(new_app(), trio).run()
        no_problems(first)
        assert not any("dropped from this server's memory" in plain(i.value) for i in first.info)
        demo_url(new_app(), pair).run()  # another selection: the trio's analysis leaves memory
        assert state.cached_analysis(state.Selection("demo:base", tuple(trio))) is None
        again = demo_url(new_app(), trio).run()
        no_problems(again)
        notes = [plain(i.value) for i in again.info if "dropped from this server's memory" in plain(i.value)]
        assert len(notes) == 1 and ANALYSIS_ENV in notes[0] and "1 analysis kept" in notes[0], notes
        assert len(again.get("plotly_chart")) >= 5  # the page drew as before
        shown = demo_url(new_app(), trio).run()  # in memory again: no note
        assert not any("dropped from this server's memory" in plain(i.value) for i in shown.info)
    finally:
        monkeypatch.delenv(ANALYSIS_ENV)
        st.cache_resource.clear()

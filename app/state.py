"""Session state, cached heavy objects and error display shared by every page (no maths here)."""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from analysis.ladder import DEFAULT_LADDER
from app import errors
from app.memory import ANALYSIS_ENV, DEFAULT_ANALYSIS_BYTES, LRUStore, limit_from_env
from merging.common.errors import RamStudioError, printable
from merging.common.units import format_bytes
from merging.reading.refs import DEMO_PREFIX, DEMO_SHARED_PREFIX, demo_names, demo_prefix, demo_root

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_EPS = 1e-5
SEL_KEY = "ram_selection"
TUNE_KEY = "ram_tuned"

# The paper's two trios (Sec. 5 and App. C.4): base first, then the three RL agents.
PRESETS: dict[str, tuple[str, list[str]]] = {
    "Paper: Qwen2.5-7B trio (code, tool, memory)": (
        "Qwen/Qwen2.5-7B-Instruct",
        ["Gen-Verse/ReasonFlux-Coder-7B", "emrecanacikgoz/Qwen2.5-7B-Instruct-ToolRL-grpo-cold",
         "BytedTsinghua-SIA/RL-MemoryAgent-7B"]),
    "Paper: Llama-3.2-3B trio (math, tool, search)": (
        "meta-llama/Llama-3.2-3B-Instruct",
        ["sunblaze-ucb/Llama-3.2-3B-Instruct-GRPO-MATH-1EPOCH", "chengq9/ToolRL-Llama3.2-3B",
         "Alibaba-NLP/ZeroSearch_google_V2_Llama_3.2_3B_Instruct"]),
}


# The two bundled demo trios: reference prefix -> (results folder next to its models folder, what it shows).
DEMO_TRIOS: dict[str, tuple[str, str]] = {
    DEMO_PREFIX: ("results", "coincidental overlap: each agent learns only its own task"),
    DEMO_SHARED_PREFIX: ("results-shared",
                         "shared skill: every agent also learns one common answer protocol (the closing tag `</a>`)"),
}


@dataclass(frozen=True)
class Selection:
    """The models every page works on: one base and the agents (reference strings)."""

    base: str
    agents: tuple[str, ...]
    source: str = "demo"  # demo | demo-shared | preset | custom

    @property
    def key(self) -> str:
        """Short string key for caches: the reference strings (and the folder of each demo trio they name)."""
        roots = sorted({str(demo_root(p)) for p in map(demo_prefix, (self.base, *self.agents)) if p})
        return "|".join((self.base, *self.agents)) + "".join(f"@{r}" for r in roots)

    @property
    def demo_trio(self) -> str | None:
        """The demo trio's prefix (`demo:`, `demo-shared:`) when every model comes from that one trio."""
        prefixes = {demo_prefix(r) for r in (self.base, *self.agents)}
        return prefixes.pop() if len(prefixes) == 1 and None not in prefixes else None

    @property
    def is_demo(self) -> bool:
        return self.demo_trio is not None


def labels(sel: Selection) -> list[str]:
    """Short names of the base and the agents, as the analysis and the charts use them (agents made distinct)."""
    from merging.reading.checkpoint import unique_labels
    from merging.reading.refs import parse_ref

    def label(ref: str) -> str:
        try:
            return parse_ref(ref).label
        except RamStudioError:
            return ref

    return [label(sel.base), *unique_labels([label(a) for a in sel.agents])]


def demo_selection(prefix: str = DEMO_PREFIX) -> Selection | None:
    """One demo trio's base plus every other model of it (`demo:base`, …), when that trio is present."""
    names = demo_names(prefix)
    if "base" not in names or len(names) < 3:
        return None
    return Selection(f"{prefix}base", tuple(f"{prefix}{n}" for n in names if n != "base"), prefix.rstrip(":"))


def demo_results(prefix: str = DEMO_PREFIX) -> Path:
    """A demo trio's results folder (table1.csv, training_log.csv): next to its models folder."""
    return demo_root(prefix).parent / DEMO_TRIOS[prefix][0]


def demo_accuracy(prefix: str = DEMO_PREFIX) -> tuple["pd.DataFrame | None", str]:
    """The demo's comparison table (rows = models, accuracy % per task + avg) and where it came from.

    table1.csv (base, agents and every merge) when present, else accuracy.csv (base and agents only).
    """
    from demo.evaluate import results_table

    return results_table(demo_results(prefix))


def demo_comparisons(prefix: str = DEMO_PREFIX) -> "pd.DataFrame | None":
    """The demo's paired comparisons of Table 1's chosen merges (table1_comparisons.csv), or None."""
    from demo.evaluate import results_comparisons

    return results_comparisons(demo_results(prefix))


def demo_fig3(prefix: str = DEMO_PREFIX) -> tuple["pd.DataFrame | None", str]:
    """The demo's Fig. 3 experiment (results/fig3.csv: unique-only merges with and without 1/N, scored, plus
    base and full-agent rows) as tidy rows [agent, variant, task, split, accuracy %]; (None, why) when the
    file is absent or unreadable. The one place that reads the file."""
    from demo.fig3 import read_results

    return read_results(demo_results(prefix) / "fig3.csv")


# ---------------------------------------------------------------- the selection, kept in the page's URL

# ?base=REF&agent=REF&agent=REF: a reload, a bookmark or a shared link opens the same models. The values are
# untrusted input (anyone can write a link): bounded, parsed like a typed reference, shown escaped.
URL_BASE, URL_AGENT = "base", "agent"
URL_ERROR_KEY = "_url_selection_error"
MAX_URL_AGENTS = 16
MAX_URL_REF = 512
_DEMO_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*$")


def source_of(base: str, agents: tuple[str, ...]) -> str:
    """What kind of selection these references are: one demo trio, a paper preset, or custom."""
    trio = Selection(base, agents).demo_trio
    if trio is not None:
        return trio.rstrip(":")
    return "preset" if any(base == b and list(agents) == a for b, a in PRESETS.values()) else "custom"


def selection_from_url(params) -> Selection | None:
    """The selection a URL's query parameters name; None when they name none. A bad value raises
    RamStudioError with one line saying which (nothing is read from the models here)."""
    from merging.reading.refs import parse_ref

    base, agents = params.get_all(URL_BASE), params.get_all(URL_AGENT)
    if not base and not agents:
        return None
    if len(base) != 1:
        raise RamStudioError("the link names no base model." if not base else "the link names more than one base "
                             "model.", "A link holds one `base` and two or more `agent` parameters.")
    if not 2 <= len(agents) <= MAX_URL_AGENTS:
        raise RamStudioError(f"the link names {len(agents)} agent(s); between 2 and {MAX_URL_AGENTS} are needed.",
                             "A link holds one `base` and two or more `agent` parameters.")
    refs = [r.strip() for r in (*base, *agents)]
    for ref in refs:
        if len(ref) > MAX_URL_REF or printable(ref) != ref:
            raise RamStudioError(f"the link holds a model reference that is too long or has control characters "
                                 f"({printable(ref, 80)!r}).", "Choose the models on the Models page.")
        prefix = demo_prefix(ref)
        name = ref[len(prefix):] if prefix else ""
        if prefix and (not _DEMO_NAME.match(name) or name in (".", "..")):
            raise RamStudioError(f"the link names an unknown demo model {printable(ref, 80)!r}.",
                                 "Demo models are named like demo:base or demo-shared:code.")
        parse_ref(ref)  # a folder that does not exist here and is no Hub id: one readable line
    return Selection(refs[0], tuple(refs[1:]), source_of(refs[0], tuple(refs[1:])))


def selection() -> Selection | None:
    """The current selection: the one the page's URL names (a reload, a bookmark, a shared link), else the
    bundled demo (None if the demo is missing)."""
    if SEL_KEY not in st.session_state:
        sel = None
        try:
            sel = selection_from_url(st.query_params)
        except RamStudioError as exc:
            st.session_state[URL_ERROR_KEY] = (exc.message, exc.hint)
        st.session_state[SEL_KEY] = sel if sel is not None else demo_selection()
    return st.session_state[SEL_KEY]


def set_selection(sel: Selection) -> None:
    st.session_state[SEL_KEY] = sel
    st.session_state.pop(URL_ERROR_KEY, None)
    sync_url(sel)


def sync_url(sel: Selection | None, extra: dict[str, list[str]] | None = None) -> None:
    """Write the selection (and `extra` parameters: the jobs this session follows, app/jobs.py) into the URL's
    query parameters, only where they changed (every page change starts from a URL without them)."""
    want = {URL_BASE: [sel.base] if sel else [], URL_AGENT: list(sel.agents) if sel else [], **(extra or {})}
    for key, values in want.items():
        if st.query_params.get_all(key) != values:
            if values:
                st.query_params[key] = values
            else:
                st.query_params.pop(key, None)


def tuned() -> dict:
    """Parameters chosen on the Tune page (the Merge page pre-fills from them)."""
    if TUNE_KEY not in st.session_state:
        st.session_state[TUNE_KEY] = {"eps": DEFAULT_EPS, "r": 0.1, "alpha": 2.0, "rule": "clip",
                                      "rho_scope": "global"}
    return st.session_state[TUNE_KEY]


def rule_params(p: dict) -> dict:
    """A λ setting's r, α and rule as subtitles, captions and file names name them: α only for the clip rule
    (the soft rule has none)."""
    return {"r": p["r"], **({"alpha": p["alpha"]} if p["rule"] == "clip" else {}), "rule": p["rule"]}


def rule_text(p: dict) -> str:
    """The same in words: "r = 0.1, α = 2, clip rule" or "r = 0.1, soft rule"."""
    return f"r = {p['r']:g}" + (f", α = {p['alpha']:g}" if p["rule"] == "clip" else "") + f", {p['rule']} rule"


# ---------------------------------------------------------------- errors (app/errors.py; the pages call them here)

show_error, guard = errors.show_error, errors.guard

def selection_or_stop() -> Selection:
    """The current selection, or (none: the demo is missing) a note saying how to choose models, and stop."""
    sel = selection()
    if sel is None:
        no_selection_note()
        st.stop()
    return sel


def no_selection_note() -> None:
    st.info("No models selected yet: the bundled demo was not found. Choose models on the **Models** page "
            "(or build the demo: `python -m demo.build`).", icon=":material/info:")


# ---------------------------------------------------------------- analysis (process-wide cache)

@dataclass
class _Store:
    lock: threading.Lock = field(default_factory=threading.Lock)  # one analysis pass at a time per server
    results: LRUStore = field(default_factory=lambda: LRUStore(
        limit_from_env(ANALYSIS_ENV, DEFAULT_ANALYSIS_BYTES), "analysis", plural="analyses"))


@st.cache_resource(show_spinner=False)
def _analysis_store() -> _Store:
    """Analysis results shared by every session, keyed by the selection's reference strings, within
    $RAM_STUDIO_APP_ANALYSIS_MEMORY bytes (least recently used dropped first: app/memory.py)."""
    return _Store()


def cached_analysis(sel: Selection):
    """The analysis of `sel` if some session already computed it in this server — or one of the same models
    listed in another order, reordered (the statistics do not depend on the order) — else None."""
    store = _analysis_store()
    hit = store.results.get(_akey(sel))
    if hit is None:
        same = _akey(Selection(sel.base, tuple(sorted(sel.agents))))
        twin = next((r for r in store.results.values() if _akey(Selection(r.refs[0] if r.refs else "",
                     tuple(sorted(r.refs[1:])))) == same), None) if sel.agents else None
        hit = twin.reordered([sel.base, *sel.agents]) if twin is not None else None
        if hit is not None:
            store.results.put(_akey(sel), hit)
    return hit


def analysis_memory() -> str:
    """What the server's analysis store holds, in words (e.g. "3 analyses kept, 12 MB of 1 GB")."""
    return _analysis_store().results.summary()


def _akey(sel: Selection) -> str:
    return f"{sel.key}#{','.join(f'{e:g}' for e in DEFAULT_LADDER)}"


def cached_statistics(sel: Selection, spec) -> tuple[dict | None, dict | None]:
    """Whole-model counts for a merge's global ρ and the shared-region diagnostics for its card, from this
    server's cached analysis of `sel`, else from the analysis cache on disk (what the CLI's merge reads: without
    it, a merge started before any page showed the analysis ran a counting pass the CLI does not)."""
    res = cached_analysis(sel)
    if res is None:
        from analysis.stats import cached_result

        res = cached_result(sel.base, list(sel.agents), getattr(spec, "on_mismatch", "error"), download=False)
    if res is None:
        return None, None
    from analysis.agreement import merge_statistics

    return merge_statistics(res, spec.method, spec.params)


def forget_analysis(sel: Selection) -> None:
    """Drop the in-memory result and make this session's next analysis re-read the weights."""
    _analysis_store().results.pop(_akey(sel))
    st.session_state["_fresh_analysis"] = True


def run_analysis(sel: Selection):
    """Analyse `sel` with a progress bar (disk-cached by the core, memory-cached here); None on error."""
    store = _analysis_store()
    hit = cached_analysis(sel)
    if hit is not None:
        return hit
    from analysis.stats import analyze, size_note

    try:
        from merging.reading.checkpoint import open_checkpoint

        with open_checkpoint(sel.base, download=False) as base:  # headers only: a cheap look before the pass
            note = size_note(base, len(sel.agents), DEFAULT_LADDER)
    except Exception:  # noqa: BLE001 — the pass below reports what is wrong with the inputs
        note = None
    if store.results.was_dropped(_akey(sel)):
        st.info("The analysis of these models was dropped from this server's memory, which keeps the most recently "
                f"used analyses within its limit ({analysis_memory()}; {ANALYSIS_ENV} sets it). It is computed again "
                "now — from the analysis cache on disk when it is there, else by reading the weights.",
                icon=":material/memory:")
    if note:
        from app.markup import md

        st.info(md(note), icon=":material/hourglass_top:")
    bar = st.progress(0.0, text="Reading base and agents…")
    from app.charts import load_library

    loader = load_library()  # the browser loads the chart library during the pass, not after it

    def on_progress(p) -> None:
        eta = f", about {p.eta:.0f} s left" if p.eta is not None else ""
        bar.progress(min(1.0, p.fraction),
                     text=f"Analysing {p.tensors_done}/{p.tensors_total} tensors · {format_bytes(p.done)} of "
                          f"{format_bytes(p.total)} read{eta}")

    try:
        with store.lock:  # one analysis pass at a time per server; a second caller then hits the cache
            hit = store.results.get(_akey(sel))
            if hit is None:
                fresh = bool(st.session_state.pop("_fresh_analysis", False))
                hit = analyze(sel.base, list(sel.agents), ladder=DEFAULT_LADDER, progress=on_progress,
                              use_cache=not fresh)
                store.results.put(_akey(sel), hit)
    except Exception as exc:  # noqa: BLE001
        bar.empty()
        loader.empty()
        show_error(exc, "The analysis")
        return None
    bar.empty()
    loader.empty()
    return hit


def analysis_or_stop(sel: Selection | None, *, allow_download: bool = False):
    """Shared page preamble: the analysis of the selection, or explain what is missing and stop."""
    if sel is None:
        no_selection_note()
        st.stop()
    res = cached_analysis(sel)
    if res is not None:
        return res
    hub = [r for r in (sel.base, *sel.agents) if is_uncached_hub(r)]
    if hub and not allow_download:
        from app import downloads

        st.warning(f"{len(hub)} of the selected models are on the Hugging Face Hub and not downloaded yet. "
                   "The analysis reads every weight once, so they must be downloaded first.",
                   icon=":material/cloud_download:")
        if not downloads.panel(hub, what="the analysis"):
            st.stop()
    res = run_analysis(sel)
    if res is None:
        st.stop()
    return res


def is_uncached_hub(ref: str) -> bool:
    from merging.reading.refs import parse_ref, resolve

    try:
        r = parse_ref(ref)
    except RamStudioError:
        return False
    if r.kind != "hub":
        return False
    try:
        resolve(r, download=False)
        return False
    except RamStudioError:
        return True


# ---------------------------------------------------------------- formatting

def fmt_count(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"

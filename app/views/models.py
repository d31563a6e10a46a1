"""Models: pick one of the two demo trios, a paper preset, or local folders / Hub ids; see the compatibility
report first."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app import frames, state
from app.markup import md, md_code
from app.tables import path_end, show_table
from merging.common.errors import RamStudioError, printable
from merging.common.units import format_bytes, format_seconds
from merging.reading.compat import ModelHeaders, check_compatibility, estimate_bytes
from merging.reading.refs import DEMO_PREFIX, DEMO_SHARED_PREFIX, demo_names, parse_ref

# Throughput assumptions for the estimate (shown to the user next to the numbers).
DOWNLOAD_BPS = 50e6
READ_BPS = 400e6

# The two bundled trios: the radio's label -> reference prefix.
DEMO_SOURCES = {"Bundled demo": DEMO_PREFIX, "Bundled demo: shared skill": DEMO_SHARED_PREFIX}
SOURCES = [*DEMO_SOURCES, *state.PRESETS, "Custom: local folders or Hub ids"]


@st.cache_data(show_spinner=False, ttl=900, max_entries=64)
def headers_for(ref: str) -> tuple[ModelHeaders, str, bool]:
    """Headers of one model without reading weights: (headers, kind, needs_download)."""
    from merging.reading.checkpoint import open_checkpoint
    from merging.reading.hub import remote_headers

    r = parse_ref(ref)
    if r.kind != "hub":
        with open_checkpoint(r, download=False) as ckpt:
            return ModelHeaders.from_checkpoint(ckpt), r.kind, False
    try:  # already in the local Hub cache: exact headers, nothing to download
        with open_checkpoint(r, download=False) as ckpt:
            return ModelHeaders.from_checkpoint(ckpt), "hub", False
    except RamStudioError:
        pass
    meta = remote_headers(r.repo_id, r.revision)
    tensors = {n: (t["dtype"], tuple(t["shape"])) for n, t in meta["tensors"].items()}
    size = sum(v for k, v in meta["file_sizes"].items() if k.endswith(".safetensors"))
    return ModelHeaders(r.label, tensors, meta["config"], size, f"{r.repo_id}@{meta['revision']}"), "hub", True


@st.cache_data(show_spinner=False, ttl=900, max_entries=16)
def agent_checks(base: str, agents: tuple[str, ...]):
    """For models on disk: the compatibility report with tied heads and added tokens resolved, the notes on
    them, the lineage warnings (a sample of each model's weights) and why added tokens would be refused."""
    from merging.reading.checkpoint import open_checkpoint
    from merging.reading.prepare import prepare_inputs

    b = open_checkpoint(base, download=False)
    ags = [open_checkpoint(a, download=False) for a in agents]
    try:
        prep = prepare_inputs(b, ags)
    finally:
        for c in [b, *ags]:
            c.release()
    refusal = prep.vocab.refusal if prep.vocab else None
    return (prep.report, prep.notes, [w.text for w in prep.lineage],
            (refusal.message, refusal.hint) if refusal else None)


def draft_refs(source: str) -> tuple[str, list[str]]:
    """The base and agents currently entered on this page (not yet in use)."""
    if source in DEMO_SOURCES:
        demo = state.demo_selection(DEMO_SOURCES[source])
        return (demo.base, list(demo.agents)) if demo else ("", [])
    if source in state.PRESETS:
        base, agents = state.PRESETS[source]
        return base, list(agents)
    sel = state.selection()
    base = st.text_input("Base model", value=sel.base if sel else "",
                         help="A folder with config.json + *.safetensors, a Hub id like org/name[@revision], "
                              "or demo:base.", key="custom_base")
    agents_text = st.text_area("Agents (one per line)", value="\n".join(sel.agents) if sel else "", height=110,
                               help="Two or more RL fine-tunes of the base.", key="custom_agents")
    return base.strip(), [a.strip() for a in agents_text.splitlines() if a.strip()]


def approx(seconds: float) -> str:
    text = format_seconds(seconds)
    return text if text.startswith("<") else "≈ " + text


def mismatch_report(rep) -> None:
    """What differs from the base, headlined by what it means, and what the 'base' policy would cost."""
    from merging.reading.compat import MAX_DROPPED_SHARE, layout_hints

    mm = rep.mismatches_frame()
    dupes = mm[mm["kind"] == "duplicate"]
    for _, row in dupes.iterrows():
        st.error(f"**{md(row['agent'])}**: {md(row['detail'])}.", icon=":material/content_copy:")
    rest = mm[mm["kind"] != "duplicate"]
    if rest.empty:
        return
    fatal = bool(rest["fatal"].any())
    agents_hit = rest["agent"].nunique()
    (st.error if fatal else st.warning)(
        f"{len(rest)} difference{'s' if len(rest) != 1 else ''} from the base in {agents_hit} agent"
        f"{'s' if agents_hit != 1 else ''}"
        + (" — some cannot be repaired: these models cannot be merged." if fatal else
           " — the 'base' policy can merge them (the output keeps the base's tensors)."),
        icon=":material/warning:")
    shown = rest.assign(tensor=rest["tensor"].fillna("—").map(path_end),  # the end names it
                        detail=rest["detail"].map(lambda t: printable(t, 200)),
                        fatal=rest["fatal"].map({True: "cannot be repaired", False: "the 'base' policy can merge"}))
    show_table(shown.rename(columns={"fatal": "repair"}), height=min(320, 36 + 35 * len(shown)))
    losses = [loss for loss in rep.losses() if loss.dropped or loss.padded]
    if losses and not fatal:
        table = pd.DataFrame([{"agent": x.agent, "elements dropped": f"{x.dropped:,}",
                               "share dropped": f"{100 * x.dropped_share:.2f} %",
                               "tensors dropped": x.dropped_tensors, "elements counted as unchanged": f"{x.padded:,}",
                               "tensors counted as unchanged": x.padded_tensors,
                               "'base' policy": "refused (loses too much)" if x.dropped_share > MAX_DROPPED_SHARE
                               else "allowed"} for x in losses])
        st.markdown("**What the 'base' policy would do to each agent**")
        show_table(table)
        for hint in layout_hints(rep.base, rep.agents):
            st.info(md(hint), icon=":material/lightbulb:")


def structure_notes(rep) -> None:
    """What the base's tensor names say (towers, MoE experts and their layout, names no rule knows), and how each
    agent stored in another layout is read in the base's."""
    from merging.reading.structure import structure_of

    structure = structure_of(rep.base.tensors)
    st.caption("Structure of the base: " + md("; ".join(structure.summary())) + ".")
    notes = rep.layout_notes()
    if notes:
        st.info("**Read in the base's layout** (the same weights, stored another way; merged and analysed as the "
                "base stores them):\n" + "\n".join(f"- {md_code(agent)}: {md(line)}" for agent, line in notes),
                icon=":material/swap_horiz:")
    if structure.unknown:
        with st.expander(f"{len(structure.unknown)} tensors of no known module kind (grouped as 'other')"):
            st.markdown("\n".join(f"- {md_code(n)}" for n in structure.unknown[:200]))


def unreadable(refs: list[str]) -> list[tuple[str, RamStudioError]]:
    """Every model whose headers cannot be read, with why (all of them, not only the first)."""
    out = []
    with st.spinner("Reading safetensors headers (no weights are read)…"):
        for ref in dict.fromkeys(refs):
            try:
                headers_for(ref)
            except RamStudioError as exc:
                out.append((ref, exc))
    return out


def show_problems(problems: list[tuple[str, RamStudioError]], n: int, lead: str = "") -> None:
    """One error box for all the models that could not be read: each named with its reason, each hint once
    (after `lead`, a Markdown sentence, when given)."""
    if len(problems) == 1:
        ref, exc = problems[0]
        text = f"**{md(f'Reading {ref} failed: {exc.message}')}**"
    else:
        text = f"**{len(problems)} of {n} models could not be read:**\n" + "\n".join(
            f"- {md_code(ref)}: {md(exc.message)}" for ref, exc in problems)
    hints = list(dict.fromkeys(exc.hint for _, exc in problems if exc.hint))
    if hints:
        text += "\n\n" + md(" ".join(hints))
    st.error((lead + "\n\n" if lead else "") + text, icon=":material/error:")


NOT_SELECTED = "**These models were not selected**: every model must be readable first."


def report(base: str, agents: list[str], lead: str = "") -> bool:
    """The compatibility report, sizes and estimate; errors become readable messages (one box for every model
    that cannot be read, after `lead` when given). True when every model could be read."""
    if not base or len(agents) < 2:
        st.info("Give a base model and at least two agents.", icon=":material/info:")
        return False
    heads: list[ModelHeaders] = []
    download = 0
    problems = unreadable([base, *agents])
    if problems:
        show_problems(problems, len(agents) + 1, lead)
        return False
    with st.spinner("Reading safetensors headers (no weights are read)…"):
        for ref in [base, *agents]:
            h, _kind, needs = headers_for(ref)
            heads.append(h)
            download += h.bytes_on_disk if needs else 0
    notes: list[str] = []
    if not download:  # every model on disk: heads, tokenizers and lineage can be checked (a small read)
        with st.spinner("Checking heads, tokenizers and lineage (a sample of each model's weights)…"):
            rep, notes, lineage, refusal = agent_checks(base, tuple(agents))
        for line in lineage:
            st.warning(f"**warning:** {md(line)}", icon=":material/family_history:")
        if refusal:
            st.warning(f"{md(refusal[0])} {md(refusal[1])}", icon=":material/translate:")
    else:
        rep = check_compatibility(heads[0], heads[1:])
    show_table(frames.models_frame(rep.models_frame(), [base, *agents]))  # a long path: by its end
    for note in notes:
        st.caption(md(note))
    structure_notes(rep)
    if rep.ok:
        st.success(f"Compatible: {len(agents)} agents share the base's {len(heads[0].tensors)} tensors, shapes and "
                   "dtypes.", icon=":material/check_circle:")
    else:
        mismatch_report(rep)
    read = sum(h.bytes_on_disk for h in heads)
    out = estimate_bytes(heads[0])
    c = st.columns(4)
    c[0].metric("To download", format_bytes(download), help="Hub weights not yet in the local cache.")
    c[1].metric("Disk needed", format_bytes(download + out), help="Downloads plus one merged model (base dtype).")
    c[2].metric("Analysis time", approx(read / READ_BPS + download / DOWNLOAD_BPS),
                help="One streaming read of every model (plus the download).")
    c[3].metric("Merge time", approx((read + out) / READ_BPS),
                help="Read every model once and write the merged one.")
    st.caption(f"Estimates assume {DOWNLOAD_BPS / 1e6:.0f} MB/s download and {READ_BPS / 1e6:.0f} MB/s disk; "
               "memory stays bounded by the chunk size whatever the model size.")
    return True


st.title("Models")
st.markdown("Choose a base model and its RL-trained agents. The report below comes from the safetensors "
            "**headers** — for Hub repos from the remote metadata, so nothing is downloaded yet; for models on disk "
            "also from their tokenizers and a small sample of their weights (is each agent a fine-tune of this base?).")

current = state.selection()
demo_source = {prefix.rstrip(":"): label for label, prefix in DEMO_SOURCES.items()}
if current is None:
    default_source = 0
elif current.source in demo_source:
    default_source = SOURCES.index(demo_source[current.source])
else:
    default_source = SOURCES.index(next((k for k, (b, _a) in state.PRESETS.items() if current.base == b), SOURCES[-1]))
source = st.radio("Models", SOURCES, index=default_source, horizontal=True, label_visibility="collapsed",
                  key="model_source")

if source in DEMO_SOURCES and state.demo_selection(DEMO_SOURCES[source]) is None:
    shared = DEMO_SOURCES[source] == DEMO_SHARED_PREFIX
    st.warning(f"This bundled demo trio is not present (no `assets/demo/models{'-shared' if shared else ''}`). "
               f"Build it with `python -m demo.build{' --suite shared' if shared else ''}`, or pick local "
               "folders.", icon=":material/warning:")
    st.stop()
if source in DEMO_SOURCES:
    st.caption(f"`{DEMO_SOURCES[source]}` trio — {state.DEMO_TRIOS[DEMO_SOURCES[source]][1]}.")

base, agents = draft_refs(source)
if source != SOURCES[-1]:
    st.markdown(f"**Base** {md_code(base)} · **Agents** " + " · ".join(md_code(a) for a in agents))

hub_refs = []
for ref in [base, *agents]:
    try:
        if ref and parse_ref(ref).kind == "hub":
            hub_refs.append(ref)
    except RamStudioError:
        pass
auto = not hub_refs  # demo and local folders are instant; Hub metadata needs a network round trip
checked = st.session_state.get("checked_refs") == [base, *agents]
cols = st.container(horizontal=True)
if not auto and cols.button("Check compatibility", icon=":material/fact_check:", key="check_compat"):
    st.session_state["checked_refs"] = [base, *agents]
    checked = True
use = cols.button("Use these models", type="primary", icon=":material/check:", key="use_models")

listed = False  # the report below already named the models that cannot be read (and said they were not selected)
if auto or checked:
    readable = False
    with state.guard("The compatibility check"):
        readable = report(base, agents, NOT_SELECTED if use else "")
    listed = not readable and bool(base) and len(agents) >= 2
    if readable and hub_refs:
        from app import downloads

        st.subheader("Download")
        downloads.panel(hub_refs, what="every page")
else:
    st.caption(f"{len(hub_refs)} model(s) are Hugging Face repos: **Check compatibility** reads their remote "
               "metadata (a few kilobytes each).")

if use:
    problems: list | None = None
    if not base or len(agents) < 2:
        state.show_error(RamStudioError("a base and at least two agents are needed.", "Add another agent."),
                         "Selecting the models")
    else:  # a mistyped path, an unknown demo model, an unreachable Hub id: each named once, in one box
        problems = unreadable([base, *agents])
    if problems and not listed:  # the report above, when it ran, already said it in its one box
        show_problems(problems, len(agents) + 1, NOT_SELECTED)
    elif problems is not None and not problems:
        kind = (DEMO_SOURCES[source].rstrip(":") if source in DEMO_SOURCES
                else "preset" if source in state.PRESETS else "custom")
        state.set_selection(state.Selection(base, tuple(agents), kind))
        st.success("Selected. Open **Heterogeneity** to analyse them.", icon=":material/check_circle:")
        st.page_link("views/heterogeneity.py", label="Go to Heterogeneity", icon=":material/arrow_forward:")

with st.expander("What the demo is"):
    present = {p: ", ".join(md_code(f"{p}{n}") for n in demo_names(p)) or "none"
               for p in (DEMO_PREFIX, DEMO_SHARED_PREFIX)}
    st.markdown(
        "A tiny Qwen2-architecture base model trained on three toy agentic tasks, then fine-tuned with RL "
        "(GRPO) into three agents: **code**, **tool** and **memory** — the paper's setting at laptop scale. "
        "It comes as **two trios**, the two regimes a merge can meet:\n\n"
        f"- **Bundled demo** (`demo:`): each agent learns only its own task, so where two agents changed the "
        f"same weight it is coincidence. Present here: {present[DEMO_PREFIX]}.\n"
        f"- **Bundled demo: shared skill** (`demo-shared:`): every task's verifier also requires the answer to "
        "end with one closing tag `</a>` that the base often forgets, so every agent's RL fixes that same habit "
        f"besides its own skill — shared knowledge, like agents tuned from one instruct base. Present here: "
        f"{present[DEMO_SHARED_PREFIX]}.")

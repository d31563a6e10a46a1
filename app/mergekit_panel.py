"""The Merge page's mergekit YAML panel: load a pasted or uploaded config into the form (translated by
merging.interop.mergekit_form), and show the form's settings as mergekit YAML."""
from __future__ import annotations

import streamlit as st

from app import state
from app.forms import DTYPE_KEY, DTYPES, OUT_CUSTOM, POLICY_KEY, SHARD_KEY, SHARD_SIZES, fill_merge_form
from app.markup import md, md_code
from merging.common.errors import RamStudioError
from merging.recipe import MergeSpec

MK_MSG = "mk_message"
MK_PANEL = "mk_panel"  # the expander's open state (kept across reruns, opened by a load)


def load_yaml_into_form() -> None:
    """Button callback (runs before the page, so it may set the form's widgets): parse the pasted or
    uploaded mergekit YAML and fill method, parameters, models and options from it."""
    from merging.interop.mergekit_form import read_mergekit_form

    upload = st.session_state.get("mk_file")
    text = upload.getvalue().decode("utf-8", "replace") if upload is not None else st.session_state.get("mk_text", "")
    where = f"{upload.name}" if upload is not None else "the pasted YAML"
    if not text.strip():
        st.session_state[MK_MSG] = ("error", "paste a mergekit YAML or upload a file first.", "")
        return
    try:
        form = read_mergekit_form(text)
    except RamStudioError as exc:
        st.session_state[MK_MSG] = ("error", f"{where}: {exc.message}", exc.hint)
        return
    spec = form.spec
    fill_merge_form(spec.method, form.values)
    st.session_state[DTYPE_KEY] = next((k for k, v in DTYPES.items() if v == spec.out_dtype), "as base")
    if spec.shard_size in SHARD_SIZES:
        st.session_state[SHARD_KEY] = spec.shard_size
    st.session_state[POLICY_KEY] = spec.on_mismatch
    st.session_state[OUT_CUSTOM] = spec.out.strip() or None
    st.session_state[MK_PANEL] = True  # the panel stays open to show what was loaded
    sel = state.selection()
    agents = tuple(spec.agents)
    if sel is None or (sel.base, sel.agents) != (spec.base, agents):
        state.set_selection(state.Selection(spec.base, agents, state.source_of(spec.base, agents)))
    if sel is not None and (sel.base, sel.agents) == (spec.base, agents):
        models = "the selected models"
    elif sel is not None and sel.base == spec.base and sorted(sel.agents) == sorted(agents):
        # Same models, another order: the merge follows the YAML's order (DARE's masks and float sums depend
        # on it); the analysis is the same, reordered, so "analysis ready" stays.
        models = ("the selected models, now in the YAML's order (" + ", ".join(map(md_code, agents)) + "; the "
                  "analysis is kept: its statistics do not depend on the order)")
    else:
        models = (f"base {md_code(spec.base)} and {len(agents)} agents (now the selected models"
                  + ("" if sel is None or state.cached_analysis(state.selection()) else
                     ": the Heterogeneity page analyses them") + ")")
    st.session_state[MK_MSG] = ("ok", f"Loaded {md(where)}: method **{md(spec.method)}** ({md(form.summary)}), {models}"
                                      + (f", output {md_code(spec.out)}" if spec.out.strip() else "") + ".", "")


def mergekit_panel(spec: MergeSpec) -> None:
    """Load a mergekit YAML into the form, and show the current settings as mergekit YAML."""
    # Keyed and stateful: its open state survives reruns, and elements appearing above it after a merge
    # (results, notes) cannot remount it closed.
    with st.expander("mergekit YAML", icon=":material/data_object:", key=MK_PANEL, on_change="rerun"):
        from merging.interop.mergekit import to_mergekit_yaml

        left, right = st.columns(2)
        with left:
            st.text_area("Paste a mergekit YAML", key="mk_text", height=180,
                         placeholder="merge_method: ram\nbase_model: org/base\nmodels:\n  - model: org/agent-a\n…")
            st.file_uploader("…or upload one", type=["yaml", "yml"], key="mk_file")
            st.button("Load into the form", icon=":material/upload:", key="mk_load", on_click=load_yaml_into_form)
            msg = st.session_state.get(MK_MSG)
            if msg and msg[0] == "ok":
                st.success(msg[1], icon=":material/check_circle:")
            elif msg:
                state.show_error(RamStudioError(msg[1], msg[2]), "Loading the YAML")
        with right:
            st.markdown("**These settings as mergekit YAML**")
            try:
                text, note = to_mergekit_yaml(spec)
            except RamStudioError as exc:
                text, note = None, exc.message
            if text is None:
                head, _, nearest = note.partition("\n")
                st.info(md(head), icon=":material/info:")
                if nearest.strip():
                    st.code(nearest.strip(), language="yaml")
            else:
                st.code(text, language="yaml")
                if note:
                    st.caption(md(note))

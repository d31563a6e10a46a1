"""The Merge page's optional upload of a finished merge to the Hugging Face Hub."""
from __future__ import annotations

import os

import streamlit as st

from app import state
from app.markup import md


def push_form(written) -> None:
    """Optional upload; the token is used for this one call and never kept (the form clears it)."""
    with st.expander("Push to the Hugging Face Hub"):
        with st.form("push", clear_on_submit=True, border=False):
            repo = st.text_input("Repository id", placeholder="your-name/merged-agents")
            private = st.checkbox("Private repository", value=True)
            token = st.text_input("Token (leave empty to use HF_TOKEN or your saved login)", type="password")
            go = st.form_submit_button("Push", icon=":material/cloud_upload:")
        if go:
            with state.guard("The upload"):
                from merging.writing.hub_upload import upload

                url = upload(written, repo, private, token or os.environ.get("HF_TOKEN") or None)
                st.success(f"Pushed to {md(url)}", icon=":material/cloud_done:")
            del token

"""The app's AppTest fixture: every module gets its own isolated, offline app environment (the demo models, a
fresh analysis cache, no Hub), Streamlit's caches cleared before and after."""
from __future__ import annotations

import pytest
import streamlit as st

from tests.app_helpers import app_env, reload_hub_client


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("apptest")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in app_env(tmp).items():
            mp.setenv(k, v)
        reload_hub_client()  # offline for real: the client read HF_HUB_OFFLINE when it was first imported
        st.cache_resource.clear()
        st.cache_data.clear()
        yield tmp
    reload_hub_client()
    st.cache_resource.clear()
    st.cache_data.clear()

"""Streamlit entry point: page config, navigation and the state every page shares.

UI only; the work is in ``auditlib``. Runs execute in the process-wide RunManager (see
``dashboard/common.py``), so the pages only start, watch and read them. The open run's id and
the uploaded assets' sha256 live in the URL (``?run=...&images=...&weights=...``, and the
open ``comparison`` and ``sweep``), so a
refresh or a shared link reopens the same state.
"""

import streamlit as st

from auditlib.engine import ray_backend
from dashboard.common import (
    COMPARE_PAGE,
    HISTORY_PAGE,
    LAB_PAGE,
    METHOD_PAGE,
    SETUP_PAGE,
    TRADEOFF_PAGE,
)
from dashboard.state import sync_url_state

st.set_page_config(
    page_title="FL gradient-leakage audit", page_icon=":material/shield:", layout="wide"
)

ray_backend.start_ray()  # in the background, once per server process
sync_url_state()

page = st.navigation(
    [
        st.Page(SETUP_PAGE, title="Setup", icon=":material/tune:", default=True),
        st.Page(LAB_PAGE, title="Attack lab", icon=":material/science:"),
        st.Page(COMPARE_PAGE, title="Compare", icon=":material/compare:"),
        st.Page(TRADEOFF_PAGE, title="Trade-off", icon=":material/ssid_chart:"),
        st.Page(HISTORY_PAGE, title="History", icon=":material/history:"),
        st.Page(METHOD_PAGE, title="Method", icon=":material/menu_book:"),
    ]
)
page.run()

"""Streamlit entry point: page config and navigation. UI only; the work is in ``auditlib``."""

import streamlit as st

st.set_page_config(
    page_title="FL gradient-leakage audit", page_icon=":material/shield:", layout="wide"
)

page = st.navigation(
    [
        st.Page("pages/audit.py", title="Audit", icon=":material/radar:", default=True),
        st.Page("pages/about.py", title="Method", icon=":material/menu_book:"),
    ]
)
page.run()

"""Streamlit entry point: page config, navigation and the state every page shares.

UI only; the work is in ``auditlib``. Every visitor signs in first (``dashboard/auth.py``)
and sees only their own runs, uploads, comparisons and sweeps (an admin sees all). Runs
execute in the process-wide RunManager (see ``dashboard/resources.py``), so the pages only
start, watch and read them. The page scripts
are in ``dashboard/pages/`` (listed in ``dashboard/navigation.py``), their helpers in
``dashboard/``. The open run's id and the uploaded assets' sha256 live in the URL
(``?run=...&images=...&weights=...``, and the open ``comparison`` and ``sweep``), so a
refresh or a shared link reopens the same state.
"""

import streamlit as st

from auditlib.engine import ray_backend
from dashboard.auth import sign_in
from dashboard.navigation import DEFAULT_PAGE, PAGES
from dashboard.state import sync_url_state

st.set_page_config(
    page_title="FL gradient-leakage audit", page_icon=":material/shield:", layout="wide"
)

ray_backend.start_ray()  # in the background, once per server process
# The page is read from the URL before the sign-in form (so a link to a run still opens it
# once its owner has signed in); no page runs before someone has signed in. The sidebar
# lists the pages' names to a visitor too: each asks for the sign-in first.
page = st.navigation(
    [st.Page(p.path, title=p.title, icon=p.icon, default=p is DEFAULT_PAGE) for p in PAGES]
)
if sign_in() is None:  # the sign-in form until someone has signed in (dashboard/auth.py)
    st.stop()
sync_url_state()
page.run()

"""The app's one way in: page config, Ray, navigation, sign-in and URL state, then the page.

``app.py`` calls :func:`run_app`. Every page script calls :func:`through_app` first: with a
``pages/`` folder beside ``app.py`` Streamlit (1.67) keeps a relic of its first multipage
mode, in which the first run of a server process (and every AppTest run) may execute a
page script directly, before ``app.py``'s ``st.navigation`` ever ran. Such a run would
skip the sign-in and the URL state; :func:`through_app` sends it through :func:`run_app`
instead, which renders the page the URL names once someone has signed in.
"""

from __future__ import annotations

import contextvars
from pathlib import Path

import streamlit as st

from auditlib.engine import ray_backend
from dashboard.auth import SignedOut, sign_in
from dashboard.navigation import DEFAULT_PAGE, PAGES
from dashboard.state import sync_url_state

ICON = str(Path(__file__).resolve().parents[1] / "assets" / "icon.png")
# True while run_app is running a page in this thread's script run (page scripts run
# synchronously inside page.run(), so a context variable reaches them; fragments re-run
# only their function, never the page's guard).
_IN_APP: contextvars.ContextVar[bool] = contextvars.ContextVar("in_app", default=False)


def run_app() -> None:
    # The icon is a file of the project: a material icon's favicon is fetched from a public
    # font host, and nothing is downloaded at run time.
    st.set_page_config(page_title="FL gradient-leakage audit", page_icon=ICON, layout="wide")
    ray_backend.start_ray()  # in the background, once per server process
    # The page is read from the URL before the sign-in form (so a link to a run still opens
    # it once its owner has signed in); no page runs before someone has signed in. The
    # sidebar lists the pages' names to a visitor too: each asks for the sign-in first.
    page = st.navigation(
        [st.Page(p.path, title=p.title, icon=p.icon, default=p is DEFAULT_PAGE) for p in PAGES]
    )
    if sign_in() is None:  # the sign-in form until someone has signed in (dashboard/auth.py)
        st.stop()
    sync_url_state()
    token = _IN_APP.set(True)
    try:
        page.run()
    except SignedOut:  # the users file changed under this run: to the sign-in form
        st.rerun()
    finally:
        _IN_APP.reset(token)


def through_app() -> None:
    """Let the page script go on only inside :func:`run_app`; otherwise run the app (which
    runs this page, signed in) and end this run."""
    if _IN_APP.get():
        return
    run_app()
    st.stop()

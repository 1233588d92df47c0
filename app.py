"""Streamlit entry point: page config, navigation and the state every page shares.

UI only; the work is in ``auditlib``. Every visitor signs in first (``dashboard/auth.py``)
and sees only their own runs, uploads, comparisons and sweeps (an admin sees all). Runs
execute in the process-wide RunManager (see ``dashboard/resources.py``), so the pages only
start, watch and read them. The page scripts are in ``pages/`` beside this file (listed in
``dashboard/navigation.py``), their helpers in ``dashboard/``; ``dashboard/entry.py`` is the
way in (page config, navigation, sign-in, URL state) that every page goes through. The open run's id and the uploaded assets' sha256 live in the URL
(``?run=...&images=...&weights=...``, and the open ``comparison`` and ``sweep``), so a
refresh or a shared link reopens the same state.
"""

import os
import sys

# The embedded Ray in its single-machine mode (its servers on 127.0.0.1), however the app is
# started: Ray reads this when it is first imported, so only before anything imports it
# (a process that already runs Ray, as AppTest's test session, is left as it is).
if not os.environ.get("AUDIT_RAY_ADDRESS") and "ray" not in sys.modules:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Ray's C++ crash handler in this process would take SIGTERM itself: a stack dump, then an
# abort before the server's lifespan could end its runs (Ray's workers keep theirs,
# ray_backend.WORKER_ENV).
if "ray" not in sys.modules:
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")

if __name__ == "__main__":  # each session's script run (and AppTest's)
    from dashboard.entry import run_app  # after the variable: it imports Ray

    run_app()
else:
    # `streamlit run app.py` imports this module and serves `app`: this script behind the
    # gate (dashboard/gate.py), which answers uploads only for signed-in sessions, bounds the
    # bytes they hold, and closes the routes that tell outsiders about the server.
    from contextlib import asynccontextmanager

    import streamlit as st
    from starlette.middleware import Middleware

    from dashboard.failures import show_failure
    from dashboard.gate import Gate

    @asynccontextmanager
    async def lifespan(_app):
        """The run engine with the server: runs a stopped process left are failed at
        start-up, not at the first page view; this process's runs end truthfully at its stop.
        Imported here, once Streamlit's runtime has started, so its caches are the real ones.
        Outside a page's script run Streamlit warns that there is no script to draw in:
        true, expected, and only noise in the server's log, so not said."""
        import logging

        quiet = logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        from dashboard.run_engine import start_engine, stop_engine

        try:
            start_engine()
        except Exception:  # the store down at start: pages say so in one line, and retry
            logging.getLogger("dashboard").exception("the run engine could not start yet")
        finally:
            quiet.setLevel(level)
        try:
            yield None
        finally:
            stop_engine()

    # A failure a page did not catch is one line on the page, never a traceback.
    app = st.App(
        __file__, lifespan=lifespan, middleware=[Middleware(Gate)], on_script_error=show_failure
    )

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

from dashboard.entry import run_app  # after the variable: it imports Ray

run_app()

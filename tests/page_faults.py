"""What counts as a fault on a dashboard page under AppTest, shared by the image and text
page tests. A leak's verdict is drawn as an error box (``st.error``) whose bold headline
opens with its level; a short run can finish before the page's own rerun after Start does,
so that box may already be on the page. It is the run's result, not a fault of the page."""

from __future__ import annotations

import re

from streamlit.testing.v1 import AppTest

VERDICT_ERROR = re.compile(r"^\*\*(Very High|High|Medium|Low): .+\*\*$", re.S)


def page_faults(at: AppTest) -> list[str]:
    """The page's error boxes other than a leak's verdict."""
    return [e.value for e in at.error if not VERDICT_ERROR.match(e.value)]

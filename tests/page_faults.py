"""What counts as a fault on a dashboard page under AppTest, shared by the image and text
page tests. A leak's verdict is drawn as an error box (``st.error``) whose bold headline
opens with its level (a labels leak's too); a short run can finish before the page's own
rerun after Start does, so that box may already be on the page. It is the run's result, not
a fault of the page."""

from __future__ import annotations

import re

from streamlit.testing.v1 import AppTest

from auditlib.metrics.risk import LEVELS
from auditlib.metrics.verdict import LABELS_LEVEL

# The levels a verdict drawn as an error opens with: a leak's bands (the text audit's are
# among them) and a labels leak's.
LEAK_LEVELS = [name for name, _ in LEVELS] + [LABELS_LEVEL]
VERDICT_ERROR = re.compile(rf"^\*\*({'|'.join(map(re.escape, LEAK_LEVELS))}): .+\*\*$", re.S)


def page_faults(at: AppTest) -> list[str]:
    """The page's error boxes other than a leak's verdict."""
    return [e.value for e in at.error if not VERDICT_ERROR.match(e.value)]

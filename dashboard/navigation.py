"""The dashboard's pages: where each page script is, its title and icon (``app.py`` builds
the navigation from ``PAGES``; pages link to each other by these paths)."""

from __future__ import annotations

from dataclasses import dataclass

PAGE_FOLDER = "pages"  # beside app.py, as the design card lays the project out


@dataclass(frozen=True)
class PageRef:
    path: str  # relative to the repository root, where app.py is
    title: str
    icon: str


SETUP = PageRef(f"{PAGE_FOLDER}/setup.py", "Setup", ":material/tune:")
LAB = PageRef(f"{PAGE_FOLDER}/lab.py", "Attack lab", ":material/science:")
SAMPLE = PageRef(f"{PAGE_FOLDER}/sample.py", "Sample", ":material/grid_view:")
COMPARE = PageRef(f"{PAGE_FOLDER}/compare.py", "Compare", ":material/compare:")
TRADEOFF = PageRef(f"{PAGE_FOLDER}/tradeoff.py", "Trade-off", ":material/ssid_chart:")
TEXT = PageRef(f"{PAGE_FOLDER}/text.py", "Text models", ":material/article:")
HISTORY = PageRef(f"{PAGE_FOLDER}/history.py", "History", ":material/history:")
METHOD = PageRef(f"{PAGE_FOLDER}/about.py", "Method", ":material/menu_book:")

PAGES = (
    SETUP,
    LAB,
    SAMPLE,
    COMPARE,
    TRADEOFF,
    TEXT,
    HISTORY,
    METHOD,
)  # in the sidebar's order; SETUP first
DEFAULT_PAGE = SETUP

"""What a deletion removed, in words: the History page's and the Text page's message."""

from __future__ import annotations

from collections.abc import Sequence

from auditlib.store import AssetInfo
from auditlib.words import count_of, size_text


def deleted_text(run_id: str, freed: Sequence[AssetInfo], what: str = "run") -> str:
    """The run and the uploads only it used (``what``: "run", "text run")."""
    text = f"Deleted {what} {run_id[:8]}"
    if not freed:
        return text + "; the uploads it used (if any) stay, other runs use them."
    size = size_text(sum(a.size for a in freed))
    names = ", ".join(a.name for a in freed)
    return f"{text} and {count_of(len(freed), 'upload')} no other run used: {names} ({size})."

"""The server's trusted-code setting: whether the dashboard may build a model class of a
user's own code (``path/to/file.py:ClassName``, ``models.own_code``), which runs that user's
file on the server.

Off unless an admin turned it on. It lives in the users file (``access.users``), beside the
roles it depends on, under ``server.allow_trusted_code`` with who set it and when: that file
is the admin's own (mode 0600, changed only by ``python -m auditlib users``), every
dashboard process reads it on each script run, and it is the one place that says who is an
admin; the store, which every run writes to, is not where a rule about running code belongs.
Only an admin changes it, by name and password (``users.set_trusted_code``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

KEY = "allow_trusted_code"  # under the users file's ``server`` section
HOW_TO_ALLOW = (
    "an admin allows it on the server with 'python -m auditlib users trusted-code on --admin NAME'"
)


@dataclass(frozen=True)
class TrustedCode:
    """Whether the dashboard runs a model class of a user's own code, and who said so when
    (``set_by``/``set_at`` None: never set, so off)."""

    allowed: bool = False
    set_by: str | None = None
    set_at: datetime | None = None  # aware, UTC

    def words(self) -> str:
        """The setting in one line, for ``users trusted-code show`` and the Setup page."""
        state = "allowed" if self.allowed else "not allowed"
        if self.set_by is None or self.set_at is None:
            return f"trusted code: {state} (the default; no admin has set it)"
        return (
            f"trusted code: {state}, set by {self.set_by} at "
            f"{self.set_at.isoformat(timespec='seconds')}"
        )

    def to_yaml(self) -> dict[str, Any] | None:
        """The users file's entry; None for a setting nobody set (nothing is written)."""
        if self.set_by is None or self.set_at is None:
            return None
        return {
            "allowed": self.allowed,
            "set_by": self.set_by,
            "set_at": self.set_at.isoformat(timespec="seconds"),
        }


def trusted_code_of(entry: Any) -> TrustedCode | str:
    """The setting a users file's entry holds, or what is wrong with it (the caller names
    the file)."""
    if entry is None:
        return TrustedCode()
    if not isinstance(entry, dict):
        return f"server.{KEY} must be a mapping with allowed, set_by and set_at"
    allowed, set_by, set_at = entry.get("allowed"), entry.get("set_by"), entry.get("set_at")
    if not isinstance(allowed, bool):
        return f"server.{KEY}.allowed must be true or false"
    if not isinstance(set_by, str) or not set_by:
        return f"server.{KEY}.set_by must name the admin who set it"
    if isinstance(set_at, datetime):  # YAML reads an unquoted timestamp as one
        when = set_at
    else:
        try:
            when = datetime.fromisoformat(str(set_at))
        except ValueError:
            return f"server.{KEY}.set_at must be an ISO 8601 time, got {set_at!r}"
    if when.tzinfo is None:
        return f"server.{KEY}.set_at must carry its time zone, got {set_at!r}"
    return TrustedCode(allowed, set_by, when)

"""The user a request acts for, and the one rule of ownership: an owner sees their own
runs, batches and uploads; an admin sees everyone's."""

from __future__ import annotations

from dataclasses import dataclass

from auditlib.errors import AuditInputError

ADMIN = "admin"
AUDITOR = "auditor"
ROLES = (AUDITOR, ADMIN)


class AccessDenied(AuditInputError):
    """A user asked for a run, batch or upload that belongs to someone else."""


@dataclass(frozen=True)
class Principal:
    username: str
    role: str = AUDITOR

    @property
    def is_admin(self) -> bool:
        return self.role == ADMIN

    def may_see(self, owner: str | None) -> bool:
        """Whether this user may see what ``owner`` owns. Records from before sign-in have no
        owner: only an admin sees them."""
        return self.is_admin or (owner is not None and owner == self.username)

    def refuse(self, what: str, owner: str | None) -> AccessDenied:
        """The refusal for ``what`` (e.g. "run 3f2a..."), in words the user can act on."""
        whose = "another user" if owner else "no one (it was recorded before sign-in)"
        return AccessDenied(
            f"{what} belongs to {whose}; you are signed in as {self.username!r}. "
            "Ask its owner or an admin to open it."
        )

"""Who may see what: the signed-in user (``Principal``), the users file with its hashed
passwords (``users``), and the refusal when a user asks for what is not theirs."""

from auditlib.access.principal import ADMIN, AUDITOR, ROLES, AccessDenied, Principal

__all__ = ["ADMIN", "AUDITOR", "ROLES", "AccessDenied", "Principal"]

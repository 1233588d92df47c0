"""Errors that reach a user as a one-line, plain-words message."""


class AuditInputError(ValueError):
    """A user-supplied input (file, number, name) is not acceptable.

    The message says what was wrong and what was expected; the CLI prints it as one line
    and the dashboard shows it next to the input.
    """


class AttackUnsupportedError(AuditInputError):
    """The chosen attack cannot run against the chosen scenario or defense."""


class RunCancelledError(Exception):
    """The run was cancelled before any attack started: it ends cancelled, without scores."""

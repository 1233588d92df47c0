"""Values as the report's words: numbers in the metric catalogue's formats, settings as
"key: value" lists, moments in UTC. Plain text, no markup (``layout.esc`` escapes it)."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from auditlib.metrics.catalogue import CATALOGUE, NOT_AVAILABLE
from auditlib.store.convert import finite_number

NOT_RECORDED = "not recorded"  # what a run stored by an earlier version did not record


def metric_text(key: str, value: Any) -> str:
    """A metric's value in its catalogue format ("n/a" where it has none)."""
    return CATALOGUE[key].text(value)


def number_text(value: Any) -> str:
    """A number that is no catalogue metric (an update norm, a budget): 3 significant digits."""
    number = finite_number(value)
    return NOT_AVAILABLE if number is None else f"{number:.3g}"


def seconds_text(value: Any) -> str:
    number = finite_number(value)
    return NOT_AVAILABLE if number is None else f"{number:.1f}"


def clip(value: Any, limit: int | None = None) -> str:
    """Any value as printable text (control characters as '?'), cut to ``limit`` with '…'."""
    text = "".join(c if c.isprintable() or c in "\n\t" else "?" for c in str(value))
    if limit is not None and len(text) > limit:
        text = text[: max(1, limit - 1)] + "…"
    return text


def named(labels: Sequence[str], most: int = 6) -> str:
    """'a, b, c and 4 more': the runs a note is about, at most ``most`` named."""
    text = ", ".join(labels[:most])
    return text + (f" and {len(labels) - most} more" if len(labels) > most else "")


def plain(value: Any) -> str:
    """A value as words: mappings as "key: value" lists, sequences comma-separated, never
    a Python repr of a dict."""
    if isinstance(value, dict):
        return "; ".join(f"{k}: {plain(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list | tuple):
        return ", ".join(plain(v) for v in value) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def settings_text(settings: Any) -> str:
    """Settings as "key: value" items; nested settings (one set per attack) one line each."""
    if isinstance(settings, dict):
        items = list(settings.items())
    elif isinstance(settings, list | tuple):
        items = [tuple(p) for p in settings if isinstance(p, list | tuple) and len(p) == 2]
    else:
        items = []
    if items and all(isinstance(v, dict) for _, v in items):
        return "\n".join(f"{k}: ({settings_text(v)})" for k, v in items)
    return "; ".join(f"{k}: {plain(v)}" for k, v in items) or "defaults"


_DICT_TAIL = re.compile(r"^(.*?)(\{.*\})\s*$")


def knowledge_text(item: str) -> str:
    """A "server knows" item whose tail is a Python dict (runs before verdicts wrote the
    client protocol so) as "key: value" words."""
    found = _DICT_TAIL.match(item)
    if found is None:
        return item
    try:
        value = ast.literal_eval(found.group(2))
    except (ValueError, SyntaxError):
        return item
    return f"{found.group(1).strip()} ({plain(value)})" if isinstance(value, dict) else item


def when(moment: datetime | None) -> str:
    if moment is None:
        return NOT_AVAILABLE
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"

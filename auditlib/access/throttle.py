"""Slowing password guessing: after a few failed sign-ins a user name, or a client
address, waits before the next try, the wait doubling with each further failure.

The policy only (no Streamlit): the dashboard's sign-in (``dashboard/auth.py``) asks
:meth:`SignInThrottle.wait_s` before it lets a try through and tells it of each failure.
Failures are counted per user name (a guesser spreading over many addresses) and per client
address (one guesser trying many names); a successful sign-in clears its user name's count.
The counts live in the server process (a restart clears them), bounded in size.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

FREE_FAILURES = 5  # failed tries before the first wait
# Then this wait (AUDIT_SIGN_IN_WAIT_S, 30 s by default), twice as long after each further
# failure, up to MAX_WAIT_S.
FIRST_WAIT_S = float(os.environ.get("AUDIT_SIGN_IN_WAIT_S", "30") or 30)
MAX_WAIT_S = 900.0
FORGET_S = 3600.0  # a key with no failure for this long starts afresh
MAX_KEYS = 10_000  # the oldest keys are forgotten beyond this many


@dataclass
class _Failures:
    count: int = 0
    last: float = 0.0
    until: float = 0.0


class SignInThrottle:
    """Failed sign-ins per key (``("user", name)``, ``("client", address)``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._keys: OrderedDict[tuple[str, str], _Failures] = OrderedDict()
        self._lock = threading.Lock()

    def wait_s(self, key: tuple[str, str]) -> float:
        """Seconds before ``key`` may try again (0: now)."""
        with self._lock:
            record = self._keys.get(key)
            return 0.0 if record is None else max(0.0, record.until - self._clock())

    def failed(self, key: tuple[str, str]) -> float:
        """Count a failure of ``key``; the wait it now has."""
        now = self._clock()
        with self._lock:
            record = self._keys.pop(key, None) or _Failures()
            if now - record.last > FORGET_S:
                record = _Failures()
            record.count += 1
            record.last = now
            if record.count >= FREE_FAILURES:
                extra = record.count - FREE_FAILURES
                record.until = now + min(FIRST_WAIT_S * 2.0**extra, MAX_WAIT_S)
            self._keys[key] = record
            while len(self._keys) > MAX_KEYS:
                self._keys.popitem(last=False)
            return max(0.0, record.until - now)

    def succeeded(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._keys.pop(key, None)

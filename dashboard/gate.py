"""The server's door: what an HTTP request may reach before Streamlit's own routes see it.

``app.py`` serves the dashboard as an ``st.App`` with :class:`Gate` as its outermost
middleware, so ``make run``, ``scripts/serve.sh`` and a plain ``streamlit run app.py`` all
go through it. Streamlit (1.67) answers uploads for any live session, signed in or not, and
serves ``/_stcore/metrics`` (bytes held by uploads, sessions) to anyone; the sign-in lives
in the session's script, which no HTTP route consults. So:

- An upload (``/_stcore/upload_file/<session>/<file>``) is answered only for a session
  whose user signed in (:data:`SIGNED_IN`, kept by ``dashboard.auth``) and is still in the
  users file with the same password; anyone else gets 403 before a byte of the body is
  read. A signed-in session's upload needs its ``Content-Length`` (which bounds the body:
  the HTTP server reads no more) and must fit under the session's and the server's caps on
  bytes held by uploads (:class:`UploadCaps`); Streamlit frees a session's files when the
  session ends, and a sign-out frees them at once.
- Routes that tell an outsider about the server (``/_stcore/metrics``) or let a program
  drive sessions (``/_stcore/agent/...``, off in config.toml as well) answer 404.

Everything else (the page, its static assets, the websocket, health) passes unchanged.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from auditlib.access.users import read_users
from auditlib.errors import AuditInputError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UPLOAD_ROUTE = "/_stcore/upload_file/"
CLOSED_ROUTES = ("/_stcore/metrics", "/_stcore/agent/")
MB = 1_000_000
# A session uploads weights (at most 500 MB, dashboard/uploads.py) and images beside them;
# the server holds a few such sessions at once on a machine of a few GB.
SESSION_CAP_MB = 600
SERVER_CAP_MB = 1500


@dataclass(frozen=True)
class UploadCaps:
    """Bytes that uploads may hold in the server's memory: per session and in all."""

    session_bytes: int
    server_bytes: int

    @classmethod
    def from_env(cls) -> UploadCaps:
        """``AUDIT_UPLOAD_SESSION_MB`` and ``AUDIT_UPLOAD_SERVER_MB`` (decimal MB)."""
        session = _megabytes("AUDIT_UPLOAD_SESSION_MB", SESSION_CAP_MB)
        server = _megabytes("AUDIT_UPLOAD_SERVER_MB", SERVER_CAP_MB)
        if server < session:
            raise AuditInputError(
                f"AUDIT_UPLOAD_SERVER_MB ({server // MB}) is below AUDIT_UPLOAD_SESSION_MB "
                f"({session // MB}); the server's cap must hold at least one session's"
            )
        return cls(session, server)


def _megabytes(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default * MB
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 1_000_000:
        raise AuditInputError(f"{name} must be a whole number of MB from 1 to 1000000, got {raw!r}")
    return value * MB


class SignedInSessions:
    """The Streamlit sessions whose user has signed in: session id -> (user, the password
    hash they signed in with). Written by the sign-in on each script run, read by the gate
    on each upload (another thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users: dict[str, tuple[str, str | None]] = {}

    def signed_in(self, session_id: str, username: str, password_hash: str | None) -> None:
        with self._lock:
            self._users[session_id] = (username, password_hash)

    def signed_out(self, session_id: str) -> bool:
        """Forget the session's sign-in; whether it had one."""
        with self._lock:
            return self._users.pop(session_id, None) is not None

    def user_of(self, session_id: str) -> str | None:
        """The session's user where they may still act: in the users file with the password
        they signed in with (a removed user or a changed password uploads nothing)."""
        with self._lock:
            entry = self._users.get(session_id)
        if entry is None:
            return None
        username, password_hash = entry
        try:
            current = read_users().password_hashes.get(username)
        except AuditInputError:
            return None
        if current is None or current != password_hash:
            self.signed_out(session_id)
            return None
        return username


SIGNED_IN = SignedInSessions()


class Gate:
    """ASGI middleware in front of Streamlit's routes (the module's docstring says why).

    ``held`` is the bytes uploads hold now, by session (Streamlit's uploaded-file manager
    by default); ``live`` whether a session id is one of the server's."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        caps: UploadCaps | None = None,
        sessions: SignedInSessions = SIGNED_IN,
        held: Callable[[], dict[str, int]] | None = None,
        live: Callable[[str], bool] | None = None,
    ) -> None:
        self.app = app
        self.caps = caps or UploadCaps.from_env()
        self.sessions = sessions
        self.held = held or _streamlit_held
        self.live = live or _streamlit_live
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {}  # bytes of uploads being received, by session

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = _route(scope)
        if path.startswith(CLOSED_ROUTES):
            await _answer(send, 404, "Not found")
            return
        if path.startswith(UPLOAD_ROUTE) and scope["method"] != "OPTIONS":
            await self._upload(path, scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _upload(self, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = path[len(UPLOAD_ROUTE) :].split("/", 1)[0]
        if not (self.live(session_id) and self.sessions.user_of(session_id)):
            await _answer(send, 403, "Sign in before uploading")
            return
        if scope["method"] != "PUT":  # a removal holds nothing new
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is None:
            await _answer(send, 411, "An upload needs its Content-Length")
            return
        refusal = self._reserve(session_id, length)
        if refusal is not None:
            await _answer(send, 413, refusal)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            with self._lock:
                left = self._in_flight.get(session_id, 0) - length
                if left > 0:
                    self._in_flight[session_id] = left
                else:
                    self._in_flight.pop(session_id, None)

    def _reserve(self, session_id: str, length: int) -> str | None:
        """Count ``length`` bytes as held by the session while they arrive; or why not."""
        held = self.held()
        with self._lock:
            session = held.get(session_id, 0) + self._in_flight.get(session_id, 0)
            server = sum(held.values()) + sum(self._in_flight.values())
            if session + length > self.caps.session_bytes:
                return (
                    f"This session's uploads would hold {(session + length) / MB:.0f} MB, over "
                    f"its cap of {self.caps.session_bytes / MB:.0f} MB; remove an upload first"
                )
            if server + length > self.caps.server_bytes:
                return (
                    f"The server's uploads would hold {(server + length) / MB:.0f} MB, over its "
                    f"cap of {self.caps.server_bytes / MB:.0f} MB; try again later"
                )
            self._in_flight[session_id] = self._in_flight.get(session_id, 0) + length
        return None


def _route(scope: Scope) -> str:
    """The request's path below Streamlit's ``server.baseUrlPath``."""
    from streamlit import config

    path = scope.get("path", "")
    base = (config.get_option("server.baseUrlPath") or "").strip("/")
    if base and path.startswith(f"/{base}/"):
        path = path[len(base) + 1 :]
    return path


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return None
            return length if length >= 0 else None
    return None


async def _answer(send: Send, status: int, text: str) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),  # the body, if any, is not read
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _streamlit_held() -> dict[str, int]:
    from streamlit import runtime

    if not runtime.exists():
        return {}
    manager = runtime.get_instance().uploaded_file_mgr
    storage = getattr(manager, "file_storage", {})  # MemoryUploadedFileManager's
    return {
        session: sum(len(record.data) for record in list(files.values()))
        for session, files in list(storage.items())
    }


def _streamlit_live(session_id: str) -> bool:
    from streamlit import runtime

    return runtime.exists() and runtime.get_instance().is_active_session(session_id)


def forget_uploads(session_id: str) -> None:
    """Drop a session's uploaded files from the server's memory now (at its sign-out)."""
    from streamlit import runtime

    if runtime.exists():
        runtime.get_instance().uploaded_file_mgr.remove_session_files(session_id)

"""The server's door (dashboard/gate.py): uploads only for signed-in sessions and within
caps on the bytes they hold, and no route that tells an outsider about the server.

These drive the ASGI middleware itself with a recording inner app; the real server behind
it is in ``test_browser.py::test_a_visitor_uploads_nothing_and_reads_no_metrics_in_a_browser``."""

from __future__ import annotations

import asyncio

import pytest

from auditlib.access.users import add_user, set_password
from auditlib.errors import AuditInputError
from dashboard.gate import MB, Gate, SignedInSessions, UploadCaps


class Inner:
    """Streamlit's routes as the gate sees them: records what reached it and reads the body."""

    def __init__(self) -> None:
        self.reached: list[str] = []
        self.body = 0

    async def __call__(self, scope, receive, send) -> None:
        self.reached.append(scope["path"])
        if scope["method"] == "PUT":
            while True:
                message = await receive()
                self.body += len(message.get("body", b""))
                if not message.get("more_body"):
                    break
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def call(gate: Gate, path: str, method: str = "PUT", length: int | None = 10) -> tuple[int, int]:
    """One request through ``gate``: its status and how many body bytes were received."""
    received = 0
    statuses: list[int] = []
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    scope = {"type": "http", "method": method, "path": path, "headers": headers}

    async def receive():
        nonlocal received
        received += length or 0
        return {"type": "http.request", "body": b"x" * (length or 0), "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    asyncio.run(gate(scope, receive, send))
    return statuses[0], received


@pytest.fixture
def users(tmp_path, monkeypatch):
    path = tmp_path / "users.yaml"
    add_user("alice", "alice-password", "auditor", path=path)
    monkeypatch.setenv("AUDIT_USERS_FILE", str(path))
    return path


def signed_in(users, session: str = "s1") -> SignedInSessions:
    from auditlib.access.users import read_users

    sessions = SignedInSessions()
    sessions.signed_in(session, "alice", read_users().password_hashes["alice"])
    return sessions


CAPS = UploadCaps(session_bytes=100, server_bytes=150)


def gate_of(sessions: SignedInSessions, held=None) -> tuple[Gate, Inner]:
    inner = Inner()
    gate = Gate(
        inner, caps=CAPS, sessions=sessions, held=held or dict, live=lambda s: s.startswith("s")
    )
    return gate, inner


def test_a_visitors_upload_is_refused_before_its_body_is_read(users):
    gate, inner = gate_of(SignedInSessions())
    status, received = call(gate, "/_stcore/upload_file/s1/f1", length=50 * MB)
    assert (status, received, inner.reached) == (403, 0, [])


def test_a_signed_in_sessions_upload_reaches_streamlit(users):
    gate, inner = gate_of(signed_in(users))
    assert call(gate, "/_stcore/upload_file/s1/f1", length=60) == (204, 60)
    assert inner.reached == ["/_stcore/upload_file/s1/f1"] and inner.body == 60
    # Another session's id (a visitor's, live but not signed in) is still refused.
    assert call(gate, "/_stcore/upload_file/s2/f1")[0] == 403


def test_a_removed_user_or_a_changed_password_uploads_nothing(users):
    sessions = signed_in(users)
    gate, _ = gate_of(sessions)
    set_password("alice", "a-new-password-1", path=users)
    assert call(gate, "/_stcore/upload_file/s1/f1")[0] == 403
    assert sessions.user_of("s1") is None  # and the session is forgotten


def test_uploads_past_the_sessions_or_the_servers_cap_are_refused_unread(users):
    held = {"s1": 50, "s9": 80}
    gate, inner = gate_of(signed_in(users), held=lambda: dict(held))
    assert call(gate, "/_stcore/upload_file/s1/f1", length=51) == (413, 0)  # 101 > 100
    assert call(gate, "/_stcore/upload_file/s1/f1", length=21) == (413, 0)  # 151 > 150 in all
    assert call(gate, "/_stcore/upload_file/s1/f1", length=20) == (204, 20)
    assert inner.body == 20


def test_an_upload_without_its_length_is_refused(users):
    gate, inner = gate_of(signed_in(users))
    assert call(gate, "/_stcore/upload_file/s1/f1", length=None) == (411, 0)
    assert inner.reached == []


def test_an_upload_being_received_counts_against_the_caps():
    """Two uploads of one session at once: the second sees the first's bytes as held."""
    sessions = SignedInSessions()
    gate, _ = gate_of(sessions)
    assert gate._reserve("s1", 60) is None
    assert "This session's uploads would hold" in gate._reserve("s1", 41)
    assert gate._reserve("s1", 40) is None


@pytest.mark.parametrize("path", ["/_stcore/metrics", "/_stcore/agent/openapi.json"])
def test_routes_that_tell_an_outsider_about_the_server_are_closed(users, path):
    gate, inner = gate_of(signed_in(users))
    assert call(gate, path, method="GET", length=None)[0] == 404
    assert inner.reached == []


def test_the_page_and_its_assets_pass(users):
    gate, inner = gate_of(SignedInSessions())
    for path in ("/", "/static/js/index.js", "/_stcore/health", "/_stcore/host-config"):
        assert call(gate, path, method="GET", length=None)[0] == 204
    assert len(inner.reached) == 4


def test_the_caps_are_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("AUDIT_UPLOAD_SESSION_MB", "10")
    monkeypatch.setenv("AUDIT_UPLOAD_SERVER_MB", "30")
    assert UploadCaps.from_env() == UploadCaps(10 * MB, 30 * MB)
    monkeypatch.setenv("AUDIT_UPLOAD_SERVER_MB", "5")
    with pytest.raises(AuditInputError, match="below AUDIT_UPLOAD_SESSION_MB"):
        UploadCaps.from_env()
    monkeypatch.setenv("AUDIT_UPLOAD_SESSION_MB", "ten")
    with pytest.raises(AuditInputError, match="whole number of MB"):
        UploadCaps.from_env()


def test_streamlit_run_app_py_serves_the_app_behind_the_gate():
    """`streamlit run app.py` (make run, serve.sh) finds app.py's st.App, whose outermost
    middleware is the gate and whose script errors are one line."""
    from pathlib import Path

    from streamlit.web.server.app_discovery import discover_asgi_app

    app_py = Path(__file__).resolve().parents[1] / "app.py"
    found = discover_asgi_app(app_py)
    assert (found.is_asgi_app, found.app_name) == (True, "app")
    source = app_py.read_text()
    assert "middleware=[Middleware(Gate)]" in source and "on_script_error=show_failure" in source


def test_a_failure_is_said_without_its_message_or_paths():
    import errno

    import sqlalchemy.exc

    from dashboard.failures import failure_line, what_failed

    stored = sqlalchemy.exc.OperationalError("SELECT", {}, Exception("/srv/data/audit.db"))
    assert what_failed(stored) == "the store (the database) did not answer"
    assert what_failed(OSError(errno.ENOSPC, "No space", "/srv/x")) == "the server's disk is full"
    full = sqlalchemy.exc.OperationalError("INSERT", {}, Exception("database or disk is full"))
    assert what_failed(full) == "the server's disk is full"  # SQLite's words for it
    assert what_failed(KeyError("/srv/secret")) == "an internal error (KeyError)"
    line = failure_line(stored, "The run could not be started")
    assert line.startswith("The run could not be started: the store (the database) did not")
    assert "/srv" not in line and "SELECT" not in line and "\n" not in line

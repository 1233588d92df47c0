"""The users file: who may sign in, with bcrypt-hashed passwords and a role.

The file is streamlit-authenticator's configuration (``credentials.usernames.<name>`` with
``name``, ``email``, ``password`` (a bcrypt hash) and ``roles``; ``cookie`` with the
re-authentication cookie's name, signing key and expiry), so the dashboard hands it to
``streamlit_authenticator.Authenticate`` as it is. It lives at ``$AUDIT_USERS_FILE``, else
``users.yaml`` in the data folder, readable by its owner only (mode 0600). Plain passwords
are never stored in it. The first admin's generated password is never printed (a log of
``make run`` or of a container would keep it): it is written to ``first-admin-password``
beside the users file, mode 0600, and the admin must choose a new password at the first
sign-in (``must_change_password``), which deletes that file. Its ``server`` section holds the
server's settings an admin makes: whether trusted code runs (``access.trusted_code``).
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from auditlib.access.principal import ADMIN, ROLES, AccessDenied, Principal
from auditlib.access.trusted_code import KEY as TRUSTED_CODE_KEY
from auditlib.access.trusted_code import TrustedCode, trusted_code_of
from auditlib.errors import AuditInputError
from auditlib.paths import data_dir

USERNAME = re.compile(r"[a-z][a-z0-9_.-]{1,31}")
USERNAME_EXPECTED = (
    "2 to 32 characters: lower-case letters, digits, '.', '_' or '-', starting with a letter"
)
MIN_PASSWORD, MAX_PASSWORD_BYTES = 8, 72  # bcrypt reads at most 72 bytes
FIRST_ADMIN = "admin"
ONE_TIME_FILE = "first-admin-password"  # beside the users file; gone with the first change
COOKIE_NAME = "auditlib_session"
COOKIE_EXPIRY_DAYS = 1.0


def users_file() -> Path:
    """``$AUDIT_USERS_FILE``, else ``users.yaml`` in the data folder."""
    configured = os.environ.get("AUDIT_USERS_FILE", "").strip()
    return Path(configured).expanduser().resolve() if configured else data_dir() / "users.yaml"


@dataclass(frozen=True)
class User:
    username: str
    role: str
    name: str = ""
    email: str = ""
    must_change: bool = False  # a generated password: a new one before anything else

    @property
    def principal(self) -> Principal:
        return Principal(self.username, self.role)


@dataclass(frozen=True)
class Users:
    """The users file as read: the users and the re-authentication cookie's settings."""

    path: Path
    users: dict[str, User]
    password_hashes: dict[str, str]
    cookie_name: str
    cookie_key: str
    cookie_expiry_days: float
    trusted_code: TrustedCode = field(default_factory=TrustedCode)  # off unless an admin set it

    def credentials(self) -> dict[str, Any]:
        """A fresh copy of the file's credentials for streamlit-authenticator, which writes
        into the dictionary it is given (login flags)."""
        return {
            "usernames": {
                u.username: {
                    "name": u.name or u.username,
                    "email": u.email,
                    "password": self.password_hashes[u.username],
                    "roles": [u.role],
                }
                for u in self.users.values()
            }
        }

    def check_password(self, username: str, password: str) -> bool:
        stored = self.password_hashes.get(username)
        if stored is None:
            return False
        return bcrypt.checkpw(password.encode()[:MAX_PASSWORD_BYTES], stored.encode())


def read_users(path: Path | None = None) -> Users:
    """The users file at ``path`` (default :func:`users_file`); a missing or damaged file is
    an AuditInputError that says how to make one."""
    path = path or users_file()
    if not path.exists():
        raise AuditInputError(
            f"no users file at {path}; create the first admin with "
            "'python -m auditlib users init' (make run does it)"
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise AuditInputError(f"the users file {path} cannot be read: {exc}") from exc
    return _parse(path, data)


def _parse(path: Path, data: Any) -> Users:
    def bad(what: str) -> AuditInputError:
        return AuditInputError(f"the users file {path} is not valid: {what}")

    if not isinstance(data, dict):
        raise bad("expected a mapping with 'credentials' and 'cookie'")
    entries = (data.get("credentials") or {}).get("usernames") or {}
    cookie = data.get("cookie") or {}
    if not isinstance(entries, dict) or not isinstance(cookie, dict):
        raise bad("'credentials.usernames' and 'cookie' must be mappings")
    users: dict[str, User] = {}
    hashes: dict[str, str] = {}
    for username, entry in entries.items():
        if not isinstance(username, str) or not USERNAME.fullmatch(username):
            raise bad(f"user name {username!r}: expected {USERNAME_EXPECTED}")
        if not isinstance(entry, dict):
            raise bad(f"user {username}: expected a mapping")
        password = entry.get("password")
        if not isinstance(password, str) or not password.startswith("$2"):
            raise bad(f"user {username}: the password must be a bcrypt hash, never plain text")
        roles = entry.get("roles") or []
        role = roles[0] if isinstance(roles, list) and len(roles) == 1 else None
        if role not in ROLES:
            raise bad(f"user {username}: roles must be one of {[[r] for r in ROLES]}")
        must_change = entry.get("must_change_password", False)
        if not isinstance(must_change, bool):
            raise bad(f"user {username}: must_change_password must be true or false")
        users[username] = User(
            username,
            role,
            str(entry.get("name") or ""),
            str(entry.get("email") or ""),
            must_change,
        )
        hashes[username] = password
    server = data.get("server") or {}
    if not isinstance(server, dict):
        raise bad("'server' must be a mapping")
    trusted = trusted_code_of(server.get(TRUSTED_CODE_KEY))
    if isinstance(trusted, str):
        raise bad(trusted)
    key = cookie.get("key")
    if not isinstance(key, str) or len(key) < 32:
        raise bad("cookie.key must be a random secret of at least 32 characters")
    try:
        expiry = float(cookie.get("expiry_days", COOKIE_EXPIRY_DAYS))
    except (TypeError, ValueError) as exc:
        raise bad("cookie.expiry_days must be a number") from exc
    name = str(cookie.get("name") or COOKIE_NAME)
    return Users(path, users, hashes, name, key, expiry, trusted)


def _write(users: Users) -> None:
    """Write atomically (a temporary file renamed over the old one), readable by the owner
    only, so a crash never leaves half a file and no other local user reads the hashes."""
    data = {
        "credentials": {
            "usernames": {
                u.username: {
                    "name": u.name,
                    "email": u.email,
                    "password": users.password_hashes[u.username],
                    "roles": [u.role],
                    **({"must_change_password": True} if u.must_change else {}),
                }
                for u in users.users.values()
            }
        },
        "cookie": {
            "name": users.cookie_name,
            "key": users.cookie_key,
            "expiry_days": users.cookie_expiry_days,
        },
    }
    trusted = users.trusted_code.to_yaml()
    if trusted is not None:
        data["server"] = {TRUSTED_CODE_KEY: trusted}
    users.path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=users.path.parent, prefix=".users-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            yaml.safe_dump(data, out, sort_keys=False)
        os.chmod(tmp, 0o600)
        os.replace(tmp, users.path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _checked_password(password: str) -> str:
    if password != password.strip():
        # The sign-in form strips what is typed (streamlit-authenticator): such a password
        # could never sign in.
        raise AuditInputError("a password cannot begin or end with a space or a line break")
    if len(password) < MIN_PASSWORD or len(password.encode()) > MAX_PASSWORD_BYTES:
        raise AuditInputError(
            f"a password needs at least {MIN_PASSWORD} characters and at most "
            f"{MAX_PASSWORD_BYTES} bytes"
        )
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()


def _empty(path: Path) -> Users:
    return Users(path, {}, {}, COOKIE_NAME, secrets.token_hex(32), COOKIE_EXPIRY_DAYS)


def add_user(
    username: str,
    password: str,
    role: str,
    *,
    name: str = "",
    email: str = "",
    must_change: bool = False,
    path: Path | None = None,
) -> User:
    """Add a user (the file is created if missing). A taken name is refused."""
    path = path or users_file()
    if not USERNAME.fullmatch(username):
        raise AuditInputError(f"user name {username!r}: expected {USERNAME_EXPECTED}")
    if role not in ROLES:
        raise AuditInputError(f"role {role!r}: expected one of {', '.join(ROLES)}")
    users = read_users(path) if path.exists() else _empty(path)
    if username in users.users:
        raise AuditInputError(f"user {username!r} exists; change a password with 'users passwd'")
    user = User(username, role, name, email, must_change)
    _write(
        replace(
            users,
            users={**users.users, username: user},
            password_hashes={**users.password_hashes, username: _checked_password(password)},
        )
    )
    return user


def set_password(username: str, password: str, *, path: Path | None = None) -> str:
    """Set ``username``'s password (a generated one is then replaced: its one-time file
    goes); returns the new hash."""
    users = read_users(path)
    if username not in users.users:
        raise AuditInputError(f"no user {username!r} in {users.path}")
    hashed = _checked_password(password)
    if users.check_password(username, password):
        raise AuditInputError("the new password is the one in use; choose another")
    user = users.users[username]
    _write(
        replace(
            users,
            users={**users.users, username: replace(user, must_change=False)},
            password_hashes={**users.password_hashes, username: hashed},
        )
    )
    if user.must_change:
        one_time_file(users.path).unlink(missing_ok=True)
    return hashed


def set_role(username: str, role: str, *, path: Path | None = None) -> None:
    """Give ``username`` ``role``; the last admin stays one (nobody could manage the users
    otherwise). An open session acts in the new role from its next click."""
    users = read_users(path)
    if username not in users.users:
        raise AuditInputError(f"no user {username!r} in {users.path}")
    if role not in ROLES:
        raise AuditInputError(f"role {role!r}: expected one of {', '.join(ROLES)}")
    user = users.users[username]
    admins = [u for u in users.users.values() if u.role == ADMIN]
    if user.role == ADMIN and role != ADMIN and len(admins) == 1:
        raise AuditInputError(f"{username!r} is the last admin; make another user admin first")
    _write(replace(users, users={**users.users, username: replace(user, role=role)}))


def remove_user(username: str, *, path: Path | None = None) -> None:
    """Remove a user; the last admin stays (nobody could manage the users otherwise). Their
    runs and uploads stay in the store, visible to admins."""
    users = read_users(path)
    if username not in users.users:
        raise AuditInputError(f"no user {username!r} in {users.path}")
    admins = [u for u in users.users.values() if u.role == ADMIN]
    if users.users[username].role == ADMIN and len(admins) == 1:
        raise AuditInputError(f"{username!r} is the last admin; add another admin first")
    _write(
        replace(
            users,
            users={k: v for k, v in users.users.items() if k != username},
            password_hashes={k: v for k, v in users.password_hashes.items() if k != username},
        )
    )


def one_time_file(path: Path) -> Path:
    """Where the first admin's generated password waits for them, beside the users file."""
    return path.parent / ONE_TIME_FILE


def init_users(path: Path | None = None) -> Path | None:
    """Create the users file with a first admin (``admin``) whose generated password must be
    changed at the first sign-in; the password is written to :func:`one_time_file` (mode
    0600, never printed), whose path is returned. ``None`` where the users file exists
    (nothing changes)."""
    path = path or users_file()
    if path.exists():
        return None
    password = secrets.token_urlsafe(12)
    target = one_time_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)  # a leftover of a users file deleted since
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(password + "\n")
    try:
        add_user(FIRST_ADMIN, password, ADMIN, name="Administrator", must_change=True, path=path)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return target


def principal_of(username: str | None, path: Path | None = None) -> Principal | None:
    """The principal a signed-in name stands for now, from the file as it is (a removed
    user is nobody; a changed role counts at once)."""
    if not username:
        return None
    user = read_users(path).users.get(username)
    return user.principal if user else None


def trusted_code_setting(path: Path | None = None) -> TrustedCode:
    """Whether this server runs a model class of a user's own code (``access.trusted_code``);
    off where there is no users file."""
    path = path or users_file()
    return read_users(path).trusted_code if path.exists() else TrustedCode()


def set_trusted_code(
    allowed: bool,
    admin: str,
    password: str,
    *,
    path: Path | None = None,
    now: datetime | None = None,
) -> TrustedCode:
    """Allow (or stop) trusted code on this server, as ``admin``, who must be an admin in the
    file now and give their password; recorded with their name and the time."""
    users = read_users(path)
    user = users.users.get(admin)
    if user is None or not users.check_password(admin, password):
        raise AccessDenied(f"no admin {admin!r} with that password in {users.path}")
    if user.role != ADMIN:
        raise AccessDenied(
            f"{admin!r} is an {user.role}; only an admin may allow or stop trusted code"
        )
    setting = TrustedCode(allowed, admin, (now or datetime.now(UTC)).replace(microsecond=0))
    _write(replace(users, trusted_code=setting))
    return setting

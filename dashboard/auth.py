"""Sign-in before any page: streamlit-authenticator over the users file
(``auditlib.access.users``: bcrypt hashes, one role per user), and the signed-in user every
page acts for.

``app.py`` calls :func:`sign_in` before a page runs and stops where nobody has signed in,
so no page renders for a visitor (the navigation has read the page from the URL before,
so a shared link to a run opens that run once its owner signs in). The role is read from
the users file on every script run, not from the session: a user removed from the file is
signed out at their next interaction, and a changed role counts at once.

A sign-in lasts as long as the browser tab's session, and no sign-in cookie is kept: the
library's re-authentication cookie (a JWT readable by the page's scripts, valid for days,
not ended by a sign-out or a new password) would sign a reloaded tab, a new tab or a copied
cookie straight back in. So its cookie is off (``cookie_expiry_days=0``) and signed with a
key of this process, which no cookie set before can match; a reload asks for the password
again and reopens the same page and run from the URL. A changed password ends the sessions
signed in with the old one at their next interaction. Guessing is slowed
(``auditlib.access.throttle``): after five failed tries a user name (any name typed, whether
or not anyone has it, so the slowing does not tell which names exist), or a client address
other than this machine's own (local browsers and a reverse proxy share those), waits 30 s,
then twice as long after each further failure; an unknown name costs the same bcrypt time
as a known one, so the time does not tell which names exist.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import secrets
from collections.abc import Callable
from typing import Any, ParamSpec

import bcrypt
import streamlit as st
import streamlit_authenticator as stauth
from streamlit import runtime
from streamlit.runtime.scriptrunner import get_script_run_ctx

from auditlib.access import Principal
from auditlib.access.throttle import FIRST_WAIT_S, FREE_FAILURES, SignInThrottle
from auditlib.access.users import MIN_PASSWORD, Users, principal_of, read_users, set_password
from auditlib.errors import AuditInputError
from dashboard.gate import SIGNED_IN, forget_uploads

P = ParamSpec("P")
PRINCIPAL_KEY = "_principal"
PASSWORD_KEY = "_password_hash"  # the hash the session signed in with
LOCKED = "locked"  # not a bcrypt hash: the library's check fails for a waiting user name
SLOWED = (
    f"After {FREE_FAILURES} failed sign-ins a user name or an address waits {FIRST_WAIT_S:.0f} s, "
    "twice as long after each further failure."
)
FORM_FIELDS = {
    "Form name": "Sign in",
    "Username": "User name",
    "Password": "Password",
    "Login": "Sign in",
    "Captcha": "Captcha",
}


@st.cache_resource
def _guard() -> tuple[SignInThrottle, str, bytes]:
    """Process-wide: the failure counts, the key no earlier cookie matches, and a hash to
    spend an unknown or waiting name's bcrypt time on."""
    dummy = bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt())
    return SignInThrottle(), secrets.token_hex(32), dummy


class _AskedNames(dict):
    """The credentials by user name, noting the name the library looks up when it checks a
    try: the name typed (lower-cased as the library does), whether or not anyone has it. A
    failure counts against that name either way: slowing only the names that exist would
    tell a guesser which do."""

    def __init__(self, entries: dict[str, Any]) -> None:
        super().__init__(entries)
        self.asked: str | None = None

    def __contains__(self, name: object) -> bool:
        self.asked = name if isinstance(name, str) else None
        return super().__contains__(name)


def _client() -> tuple[str, str] | None:
    """The client's address as a throttle key; None for this machine's own addresses (every
    local browser, and every user behind a reverse proxy on this machine, shares them: a lock
    on them would let one guesser lock everybody out) and where Streamlit gives none."""
    address = st.context.ip_address
    if not address:
        return None
    try:
        if ipaddress.ip_address(address).is_loopback:
            return None
    except ValueError:
        return None
    return ("client", address)


def _credentials(users: Users, throttle: SignInThrottle) -> dict[str, Any]:
    """The library's credentials for this run, from the users file; a waiting name's hash
    is LOCKED, so even its right password fails until the wait is over."""
    entries = users.credentials()["usernames"]
    for name, entry in entries.items():
        if throttle.wait_s(("user", name)) > 0:
            entries[name] = {**entry, "password": LOCKED}
    return {"usernames": entries}


def _failed(throttle: SignInThrottle, name: str | None, *, known: bool, dummy: bytes) -> None:
    """Count and say a failed try for ``name`` (as typed), in the same words and the same
    time whether or not anyone has that name."""
    waiting = 0.0 if name is None else throttle.wait_s(("user", name))
    if not known or waiting > 0:  # no bcrypt check ran: spend the time a known name's takes
        bcrypt.checkpw(b"not the password", dummy)
    if waiting > 0:  # the try was not let through, so it does not count again
        wait = waiting
    else:
        keys = [k for k in (("user", name) if name else None, _client()) if k is not None]
        wait = max((throttle.failed(k) for k in keys), default=0.0)
    st.error(
        "Username or password is incorrect."
        + (f" Too many failed sign-ins: {_wait_words(wait)}." if wait > 0 else "")
    )
    st.caption(SLOWED)


def _wait_words(seconds: float) -> str:
    return f"try again in {math.ceil(seconds)} s"


def sign_in() -> Principal | None:
    """The signed-in user, or None while there is none: then the sign-in form is shown and
    ``app.py`` stops before any page runs."""
    try:
        users = read_users()
    except AuditInputError as exc:
        st.error(f"Sign-in is not set up: {exc}")
        st.stop()
    throttle, key, dummy = _guard()
    signed_in = bool(st.session_state.get("authentication_status"))
    # The form in a slot of its own, emptied on the run that signs in: drawn on that run, it
    # would otherwise stay above the page until the next click (issue 52).
    form = st.empty()
    slot = form.container()
    if not signed_in:
        with slot:
            st.title("FL gradient-leakage audit")
            st.caption("Sign in to see your runs, uploads, comparisons and sweeps.")
        client = _client()
        wait = 0.0 if client is None else throttle.wait_s(client)
        if wait > 0:
            st.error(f"Too many failed sign-ins from this address: {_wait_words(wait)}.")
            st.caption(SLOWED)
            st.stop()
        if st.session_state.get("authentication_status") is False:
            st.session_state["authentication_status"] = None  # a failure counts on its run
    credentials = _credentials(users, throttle)
    authenticator = stauth.Authenticate(
        credentials,
        users.cookie_name,
        key,  # this process's: no cookie issued before can sign anyone in
        0,  # no sign-in cookie: the tab's session is the sign-in
        auto_hash=False,  # the file holds bcrypt hashes only
    )
    # The library keeps this dictionary and rebuilt its names (lower-cased): watch which
    # name the try is for.
    asked = credentials["usernames"] = _AskedNames(credentials["usernames"])
    with slot:
        try:
            authenticator.login(location="main", fields=FORM_FIELDS)
        except Exception as exc:  # the package's LoginError: say it, keep the form
            st.error(str(exc))
    status = st.session_state.get("authentication_status")
    if status is False:
        _failed(throttle, asked.asked, known=asked.asked in users.users, dummy=dummy)
    username = st.session_state.get("username")
    principal = principal_of(username) if status else None
    if principal is not None:
        current = users.password_hashes.get(principal.username)
        if not signed_in:  # signed in on this run
            throttle.succeeded(("user", principal.username))
            form.empty()
        if PASSWORD_KEY not in st.session_state:  # remember with which password
            st.session_state[PASSWORD_KEY] = current
        elif st.session_state[PASSWORD_KEY] != current:
            _sign_out(authenticator)  # the password changed since: sign in with the new one
            st.session_state["_signed_out_why"] = "Your password was changed; sign in again."
            st.rerun()
    why = st.session_state.pop("_signed_out_why", None)
    if why and principal is None:
        st.info(why)
    if principal is None:
        _session_signed_out()
        st.session_state.pop(PRINCIPAL_KEY, None)
        if status:  # signed in, but no longer in the users file
            authenticator.logout(location="unrendered")
            st.error("This account no longer exists; sign in again.")
        return None
    if users.users[principal.username].must_change:  # a generated password: none of the pages
        _session_signed_out()  # no uploads until the password is chosen
        _choose_password(principal.username, authenticator)
        return None
    st.session_state[PRINCIPAL_KEY] = principal
    ctx = get_script_run_ctx()
    if ctx is not None:  # the gate answers this session's uploads (dashboard/gate.py)
        SIGNED_IN.signed_in(ctx.session_id, principal.username, st.session_state[PASSWORD_KEY])
    with st.sidebar:
        st.caption(f"Signed in as **{principal.username}** ({principal.role})")
        if st.button("Sign out", key="sign_out"):
            _sign_out(authenticator)
            st.query_params.clear()
            st.rerun()
    return principal


def _choose_password(username: str, authenticator: stauth.Authenticate) -> None:
    """The only thing a user with a generated password (the first admin) can do: choose
    their own, which ends the one-time password (and deletes its file)."""
    st.title("Choose your password")
    st.caption(
        f"The password of {username} was generated when the dashboard was set up. Choose "
        f"your own before anything else: at least {MIN_PASSWORD} characters, no space at "
        "either end, not the generated one."
    )
    with st.form("choose_password"):
        new = st.text_input("New password", type="password")
        again = st.text_input("New password, again", type="password")
        chosen = st.form_submit_button("Set my password")
    if chosen:
        if new != again:
            st.error("The two passwords differ.")
        else:
            try:
                st.session_state[PASSWORD_KEY] = set_password(username, new)
            except AuditInputError as exc:
                st.error(f"Not changed: {exc}")
            else:
                st.rerun()  # signed in with the new password: the pages now
    with st.sidebar:
        if st.button("Sign out", key="sign_out"):
            _sign_out(authenticator)
            st.rerun()


def _sign_out(authenticator: stauth.Authenticate | None = None) -> None:
    """End this session's sign-in: the library's state, every key of the session, and the
    downloads Streamlit still serves for it (``/media/...``; its images never go there:
    ``dashboard/image_display.inline``)."""
    if authenticator is not None:
        authenticator.logout(location="unrendered")
    for name in list(st.session_state):
        del st.session_state[name]
    _session_signed_out()
    _forget_media()


def _session_signed_out() -> None:
    """The gate takes no more uploads from this session, and what it uploaded is dropped."""
    ctx = get_script_run_ctx()
    if ctx is not None and SIGNED_IN.signed_out(ctx.session_id):
        forget_uploads(ctx.session_id)


def _forget_media() -> None:
    """Drop the session's files from Streamlit's media store now, not at a later run: a
    download is kept for one sweep after its last reference, so two sweeps delete it."""
    ctx = get_script_run_ctx()
    if ctx is None:
        return
    manager = runtime.get_instance().media_file_mgr
    manager.clear_session_refs(ctx.session_id)
    manager.remove_orphaned_files()
    manager.remove_orphaned_files()


class SignedOut(Exception):
    """The session's user may no longer act: signed out already, removed from the users
    file, or their password changed since this session signed in. The session is signed
    out already."""


def _still_signed_in(principal: Principal) -> Principal | None:
    """``principal`` as the users file has them now (their role re-read), or None where they
    are gone or signed in with a password that is no longer theirs."""
    try:
        users = read_users()
    except AuditInputError:
        return None
    current = users.password_hashes.get(principal.username)
    if current is None or current != st.session_state.get(PASSWORD_KEY):
        return None
    return users.users[principal.username].principal


def current_principal() -> Principal:
    """The user this script run, callback or fragment acts for, re-read from the users file.

    A button's callback runs before ``app.py`` (and so before :func:`sign_in`), and a
    refreshing fragment never runs ``app.py`` at all: both would otherwise act for the
    session's user as the last full run saw them. Raises :class:`SignedOut` (after signing
    the session out) where that user is gone or their password changed; a changed role
    counts at once; also where the session holds no user (signed out since)."""
    principal = st.session_state.get(PRINCIPAL_KEY)
    if not isinstance(principal, Principal):
        # A page runs only after app.py signed in, but a callback or a refreshing fragment
        # can still run after its session signed out (Sign out clicked in between).
        raise SignedOut("")
    fresh = _still_signed_in(principal)
    if fresh is None:
        _sign_out()
        st.session_state["_signed_out_why"] = "Your account or password changed; sign in again."
        raise SignedOut(principal.username)
    if fresh != principal:
        st.session_state[PRINCIPAL_KEY] = fresh
    return fresh


def signed_in_only(callback: Callable[P, None]) -> Callable[P, None]:
    """A widget callback that does nothing where its session's user may no longer act (the
    next run then shows the sign-in form)."""

    @functools.wraps(callback)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            current_principal()
        except SignedOut:
            return
        callback(*args, **kwargs)

    return guarded


def signed_in_fragment(view: Callable[P, None]) -> Callable[P, None]:
    """A fragment's body that reruns the whole app (to its sign-in form) where its session's
    user may no longer act, instead of drawing another refresh for them."""

    @functools.wraps(view)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            current_principal()
            view(*args, **kwargs)
        except SignedOut:
            st.rerun(scope="app")

    return guarded

"""Sign-in before any page: streamlit-authenticator over the users file
(``auditlib.access.users``: bcrypt hashes, one role per user), and the signed-in user every
page acts for.

``app.py`` calls :func:`sign_in` before a page runs and stops where nobody has signed in,
so no page renders for a visitor (the navigation has read the page from the URL before,
so a shared link to a run opens that run once its owner signs in). The role is read from the users file on every script run,
not from the cookie or the session: a user removed from the file is signed out at their
next interaction, and a changed role counts at once.
"""

from __future__ import annotations

import streamlit as st
import streamlit_authenticator as stauth

from auditlib.access import Principal
from auditlib.access.users import principal_of, read_users
from auditlib.errors import AuditInputError

PRINCIPAL_KEY = "_principal"
FORM_FIELDS = {
    "Form name": "Sign in",
    "Username": "User name",
    "Password": "Password",
    "Login": "Sign in",
    "Captcha": "Captcha",
}


def sign_in() -> Principal | None:
    """The signed-in user, or None while there is none: then the sign-in form is shown and
    ``app.py`` stops before any page runs."""
    try:
        users = read_users()
    except AuditInputError as exc:
        st.error(f"Sign-in is not set up: {exc}")
        st.stop()
    authenticator = stauth.Authenticate(
        users.credentials(),
        users.cookie_name,
        users.cookie_key,
        users.cookie_expiry_days,
        auto_hash=False,  # the file holds bcrypt hashes only
    )
    if not st.session_state.get("authentication_status"):
        st.title("FL gradient-leakage audit")
        st.caption("Sign in to see your runs, uploads, comparisons and sweeps.")
    try:
        authenticator.login(location="main", fields=FORM_FIELDS)
    except Exception as exc:  # the package's LoginError: say it, keep the form
        st.error(str(exc))
    status = st.session_state.get("authentication_status")
    if status is False:
        st.error("Username or password is incorrect.")
    principal = principal_of(st.session_state.get("username")) if status else None
    if principal is None:
        st.session_state.pop(PRINCIPAL_KEY, None)
        if status:  # signed in, but no longer in the users file
            authenticator.logout(location="unrendered")
            st.error("This account no longer exists; sign in again.")
        return None
    st.session_state[PRINCIPAL_KEY] = principal
    with st.sidebar:
        st.caption(f"Signed in as **{principal.username}** ({principal.role})")
        if st.button("Sign out", key="sign_out"):
            authenticator.logout(location="unrendered")
            for key in list(st.session_state):
                del st.session_state[key]
            st.query_params.clear()
            st.rerun()
    return principal


def current_principal() -> Principal:
    """The user this script run acts for (set by :func:`sign_in` in ``app.py``)."""
    principal = st.session_state.get(PRINCIPAL_KEY)
    if not isinstance(principal, Principal):
        raise RuntimeError("no signed-in user: app.py signs in before any page runs")
    return principal

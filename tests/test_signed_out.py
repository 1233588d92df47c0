"""A callback or a refreshing fragment that runs after its session signed out is a signed-out
session (the sign-in form next), not a page that could not be shown."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest


def _script() -> None:
    import streamlit as st

    from dashboard.auth import SignedOut, current_principal

    try:
        current_principal()
    except SignedOut:
        st.write("signed out")


def test_a_session_without_a_user_is_signed_out_not_an_error():
    app = AppTest.from_function(_script).run(timeout=30)
    assert not app.exception
    assert [m.value for m in app.markdown] == ["signed out"]

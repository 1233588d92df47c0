"""Password guessing is slowed: five free failures, then a wait that doubles, per user name
and per client address; a success clears the name; the right password works after the wait."""

from auditlib.access.throttle import FIRST_WAIT_S, FREE_FAILURES, MAX_WAIT_S, SignInThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_waits_start_after_the_free_failures_and_double_up_to_the_cap():
    clock = Clock()
    throttle = SignInThrottle(clock)
    key = ("user", "admin")
    waits = [throttle.failed(key) for _ in range(FREE_FAILURES + 6)]
    assert waits[: FREE_FAILURES - 1] == [0.0] * (FREE_FAILURES - 1)
    expected = [min(FIRST_WAIT_S * 2**k, MAX_WAIT_S) for k in range(7)]
    assert waits[FREE_FAILURES - 1 :] == expected
    assert throttle.wait_s(key) == expected[-1]
    assert throttle.wait_s(("user", "alice")) == 0.0  # another name is not slowed
    clock.now += expected[-1]
    assert throttle.wait_s(key) == 0.0  # the right password works again after the wait
    throttle.succeeded(key)
    assert throttle.failed(key) == 0.0  # a success starts the count afresh


def test_a_key_is_forgotten_after_an_hour_without_failures():
    clock = Clock()
    throttle = SignInThrottle(clock)
    key = ("client", "127.0.0.1")
    for _ in range(FREE_FAILURES):
        throttle.failed(key)
    assert throttle.wait_s(key) == FIRST_WAIT_S
    clock.now += 3601
    assert throttle.failed(key) == 0.0


def test_a_password_the_sign_in_form_would_strip_is_refused(tmp_path):
    """Issue 33, item 12: the form strips what is typed, so such a password never signs in."""
    import pytest

    from auditlib.access.users import add_user, read_users, set_password
    from auditlib.errors import AuditInputError

    path = tmp_path / "users.yaml"
    for password in (" leading-space-pw", "trailing-space-pw ", "newline-password\n"):
        with pytest.raises(AuditInputError, match="cannot begin or end with a space"):
            add_user("carol", password, "auditor", path=path)
    add_user("carol", "inner space password", "auditor", path=path)
    assert read_users(path).check_password("carol", "inner space password")
    with pytest.raises(AuditInputError, match="cannot begin or end"):
        set_password("carol", "new-password ", path=path)

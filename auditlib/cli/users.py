"""``python -m auditlib users``: who may sign in to the dashboard (``auditlib.access.users``).

``init`` creates the users file with a first admin, whose generated password is written to
a file readable by its owner only, never printed (``make run`` calls it, so a fresh machine
starts in one command; the dashboard asks for a new password at the first sign-in); ``add``, ``passwd``,
``role``, ``remove`` and ``list`` manage it; ``trusted-code on|off --admin NAME`` allows or
stops a model class of a user's own code in the dashboard (``access.trusted_code``), as
that admin, whose password is asked for, and ``trusted-code show`` says how it is. Passwords are asked for without echo, or read from the
first line of stdin with ``--password-stdin``; they are never taken as arguments (they
would stay in the shell's history and in the process list).
"""

from __future__ import annotations

import argparse
import getpass
import sys

from auditlib.access.users import (
    FIRST_ADMIN,
    add_user,
    init_users,
    one_time_file,
    read_users,
    remove_user,
    set_password,
    set_role,
    set_trusted_code,
    trusted_code_setting,
    users_file,
)
from auditlib.errors import AuditInputError


def _password(args: argparse.Namespace, *, confirm: bool = True) -> str:
    if args.password_stdin:
        line = sys.stdin.readline().rstrip("\r\n")
        if not line:
            raise AuditInputError("--password-stdin: the first line of stdin is empty")
        return line
    first = getpass.getpass(f"Password for {args.username}: ")
    if not confirm:
        return first
    if getpass.getpass("Again: ") != first:
        raise AuditInputError("the two passwords differ")
    return first


def users_command(args: argparse.Namespace) -> int:
    path = users_file()
    if args.action == "init":
        one_time = init_users(path)
        if one_time is None:
            users = read_users(path)
            waiting = one_time_file(path)
            print(f"users: {path} ({len(users.users)} user(s)); sign in as one of them")
            if waiting.exists():
                print(f"'{FIRST_ADMIN}' has not chosen a password yet: it is in {waiting}")
        else:
            print(
                f"Created {path} with the admin '{FIRST_ADMIN}'. Its one-time password is in\n\n"
                f"    {one_time}\n\n"
                "(readable by you only; never printed, so no log keeps it). The dashboard asks "
                "for a new password at the first sign-in and the file goes then; or set one "
                f"now with 'python -m auditlib users passwd {FIRST_ADMIN}'."
            )
        return 0
    if args.action == "add":
        user = add_user(
            args.username, _password(args), args.role, name=args.name, email=args.email, path=path
        )
        print(f"added {user.username} ({user.role}) to {path}")
    elif args.action == "passwd":
        set_password(args.username, _password(args), path=path)
        print(f"changed the password of {args.username}")
    elif args.action == "role":
        set_role(args.username, args.role, path=path)
        print(f"{args.username} is now {args.role}; it counts at their next click")
    elif args.action == "remove":
        remove_user(args.username, path=path)
        print(f"removed {args.username}; their runs and uploads stay, visible to admins")
    elif args.action == "trusted-code":
        return _trusted_code(args, path)
    elif args.action == "list":
        for user in read_users(path).users.values():
            print(f"{user.username}\t{user.role}\t{user.name}")
    return 0


def _trusted_code(args: argparse.Namespace, path) -> int:
    if args.state == "show":
        print(trusted_code_setting(path).words())
        return 0
    if not args.admin:
        raise AuditInputError(
            f"trusted-code {args.state} is set by an admin: add --admin NAME (their password "
            "is asked for)"
        )
    args.username = args.admin  # whose password _password asks for
    setting = set_trusted_code(
        args.state == "on", args.admin, _password(args, confirm=False), path=path
    )
    print(setting.words())
    if setting.allowed:
        print(
            "The dashboard now builds a model class of a user's own code from the .py file "
            "they upload beside an observed update, after they tick that they trust it; it "
            "runs in a process of its own on this server's workers. Stop it with "
            "'python -m auditlib users trusted-code off --admin NAME'."
        )
    return 0

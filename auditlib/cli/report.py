"""``python -m auditlib report``: the PDF report of a stored run, comparison or sweep."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from auditlib.access import Principal
from auditlib.errors import AuditInputError


def _existing_store(url: str):
    """The store at ``url``; a SQLite file that does not exist is refused, not created."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from auditlib.store import Store

    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise AuditInputError(f"--db {url!r} is not a database URL ({exc})") from exc
    database = parsed.database
    if (
        parsed.get_backend_name() == "sqlite"
        and database
        and database != ":memory:"
        and not database.startswith("file:")
        and not Path(database).is_file()
    ):
        raise AuditInputError(f"no database at {database}")
    return Store(url)


def acting_user(name: str | None) -> Principal | None:
    """The user the command acts for: ``name`` or ``$AUDIT_USER``, who must be in the users
    file. Without a users file (the CLI alone, no dashboard) nobody is named and every run
    is read; the database's own file permissions are then the only boundary."""
    from auditlib.access.users import read_users, users_file

    name = name or os.environ.get("AUDIT_USER", "").strip() or None
    path = users_file()
    if not path.exists():
        if name:
            raise AuditInputError(f"--user {name}: there is no users file at {path}")
        return None
    if not name:
        raise AuditInputError(
            f"name the user the report is for: --user NAME or AUDIT_USER (users in {path})"
        )
    user = read_users(path).users.get(name)
    if user is None:
        raise AuditInputError(f"--user {name}: no such user in {path}")
    return user.principal


def report_command(args: argparse.Namespace) -> int:
    from auditlib.report.pdf import build_report
    from auditlib.report.subject import batch_subject, run_subject
    from auditlib.store import default_database_url
    from auditlib.store.scoped import UserStore

    out = Path(args.out)
    if out.is_dir():
        raise AuditInputError(f"--out {out} is a folder; give the PDF file to write")
    if not out.parent.is_dir():
        raise AuditInputError(f"--out {out}: the folder {out.parent} does not exist")
    if args.text_result:  # a file the CLI wrote, read as JSON: no store, no user
        from auditlib.report.text_pdf import build_text_report
        from auditlib.text_result_read import load_text_result

        text = build_text_report(
            load_text_result(args.text_result), out, mask_private=args.mask_private
        )
        print(f"wrote {text.path} ({text.pages} pages{', masked' if text.masked else ''})")
        return 0
    if args.mask_private:
        raise AuditInputError("--mask-private masks a text audit's PDF (--text-result)")
    principal = acting_user(args.user)
    with _existing_store(args.db or default_database_url()) as raw:
        store = raw if principal is None else UserStore(raw, principal)
        subject = run_subject(store, args.run) if args.run else batch_subject(store, args.batch)
        info = build_report(subject, out, charts=not args.no_charts)
    charts = "" if info.charts_drawn else f"; no charts: {info.charts_unavailable_reason}"
    print(f"wrote {info.path} ({info.pages} pages{charts})")
    return 0

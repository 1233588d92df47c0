"""``python -m auditlib report``: the PDF report of a stored run, comparison or sweep."""

from __future__ import annotations

import argparse
from pathlib import Path

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


def report_command(args: argparse.Namespace) -> int:
    from auditlib.report.pdf import build_report
    from auditlib.report.subject import batch_subject, run_subject
    from auditlib.store import default_database_url

    out = Path(args.out)
    if out.is_dir():
        raise AuditInputError(f"--out {out} is a folder; give the PDF file to write")
    if not out.parent.is_dir():
        raise AuditInputError(f"--out {out}: the folder {out.parent} does not exist")
    with _existing_store(args.db or default_database_url()) as store:
        subject = run_subject(store, args.run) if args.run else batch_subject(store, args.batch)
        info = build_report(subject, out, charts=not args.no_charts)
    charts = "" if info.charts_drawn else f"; no charts: {info.charts_unavailable_reason}"
    print(f"wrote {info.path} ({info.pages} pages{charts})")
    return 0

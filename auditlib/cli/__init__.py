"""Command line: ``python -m auditlib audit ...`` runs one audit and writes its results;
``utility`` trains under a defense; ``report`` writes the PDF report of stored runs;
``params`` lists an attack's or a defense's parameters (type, default, range, description);
``models`` lists the architectures ``--model`` takes (built-ins and ``torchvision:NAME``);
``users`` manages who may sign in to the dashboard.

Exit codes: 0 done, 2 bad input (one line on stderr saying what was expected), 1 failure.
"""

from __future__ import annotations

import os
import sys

from auditlib.cli.arguments import build_parser
from auditlib.cli.audit import audit_command
from auditlib.cli.models import models_command
from auditlib.cli.params import params_command
from auditlib.cli.report import report_command
from auditlib.cli.users import users_command
from auditlib.cli.utility import utility_command
from auditlib.errors import AuditInputError

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "audit":
            return audit_command(args)
        if args.command == "utility":
            return utility_command(args)
        if args.command == "report":
            return report_command(args)
        if args.command == "params":
            return params_command(args)
        if args.command == "models":
            return models_command(args)
        if args.command == "users":
            return users_command(args)
    except AuditInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("AUDIT_DEBUG"):
            raise
        print(
            f"error: the audit failed: {type(exc).__name__}: {exc} (AUDIT_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1
    return 1

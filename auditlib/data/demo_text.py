"""The demo text of the text-model audit, read offline: the King James Bible (public domain),
from Debian's ``bible-kjv`` package (``make setup`` installs it) through its ``bible`` program.

The Old Testament is the public text (the demo tokenizer is trained on it, and the best
guess without the update is taken from it); the New Testament is the private text the
client trains on. Nothing is downloaded: without the package the demo says so.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass

from auditlib.errors import AuditInputError

BIBLE_PROGRAM = "bible"
SOURCE = "King James Bible (public domain), Debian package bible-kjv"
_WHOLE_BOOK = "gen1:1-rev22:21"
_FIRST_PRIVATE_BOOK = "Matthew"
_VERSE = re.compile(r"^\s+\d+ (.+)$")


@dataclass(frozen=True)
class DemoText:
    public: tuple[str, ...]  # Old Testament verses: the tokenizer's and the guesser's text
    private: tuple[str, ...]  # New Testament verses: what the client trains on
    source: str


def _bible_lines() -> list[str]:
    program = shutil.which(BIBLE_PROGRAM)
    if program is None:
        raise AuditInputError(
            "the demo text needs Debian's bible-kjv package (its 'bible' program); "
            "'make setup' installs it as root, or run 'apt-get install bible-kjv'; "
            "or give your own text file"
        )
    out = subprocess.run(
        [program, "-l100000", _WHOLE_BOOK], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.splitlines()


@functools.lru_cache(maxsize=1)
def demo_text() -> DemoText:
    """The verses, one per entry, split into the public and the private part."""
    public: list[str] = []
    private: list[str] = []
    target = public
    for line in _bible_lines():
        match = _VERSE.match(line)
        if match:
            target.append(" ".join(match.group(1).split()))
        elif line.strip().startswith(_FIRST_PRIVATE_BOOK + " "):
            target = private
    if len(public) < 1000 or len(private) < 1000:
        raise AuditInputError(
            f"the bible program gave {len(public)} public and {len(private)} private verses; "
            "expected the whole King James Bible (about 23,000 and 8,000)"
        )
    return DemoText(public=tuple(public), private=tuple(private), source=SOURCE)

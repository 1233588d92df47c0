"""Small wording helpers shared by the verdict, the pages and the report."""

from __future__ import annotations


def count_of(n: int, noun: str) -> str:
    """'1 image', '2 images', '1,000 steps': a count with its noun in the right number."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")

"""Small wording helpers shared by the verdict, the pages and the report."""

from __future__ import annotations


def count_of(n: int, noun: str) -> str:
    """'1 image', '2 images', '1,000 steps': a count with its noun in the right number."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


MB = 10**6  # decimal megabytes, as the browser's upload widget counts them


def size_text(num_bytes: int) -> str:
    """'44.9 MB', '20 MB', '1,000 bytes': a size as the dashboard, the CLI and the errors
    show it."""
    if num_bytes < MB:
        return f"{num_bytes:,} bytes"
    return f"{num_bytes / MB:.1f}".removesuffix(".0") + " MB"

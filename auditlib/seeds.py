"""Independent, reproducible seeds for each random part of a run."""

import hashlib


def derive_seed(seed: int, purpose: str) -> int:
    """A 63-bit seed for ``purpose`` ("attack", "defense", ...) derived from the run seed."""
    digest = hashlib.sha256(f"{seed}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1

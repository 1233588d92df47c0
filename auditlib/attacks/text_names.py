"""The text attacks' names, light to import (the CLI's choices): the registry in
``auditlib.attacks.text`` holds one entry per name (tests/test_text_audit.py checks)."""

TEXT_ATTACK_NAMES = ("dager", "lamp", "tag", "tiger", "utr")

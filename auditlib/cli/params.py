"""``python -m auditlib params``: an attack's or a defense's parameters, each with its type,
default, range and description (``config.field_info``)."""

from __future__ import annotations

import argparse
import textwrap

from auditlib.errors import AuditInputError


def _wrapped(text: str, indent: int) -> str:
    return textwrap.fill(
        text, width=100, initial_indent=" " * indent, subsequent_indent=" " * indent
    )


def params_text(name: str) -> str:
    """The parameters of attack or defense ``name``, from their declarations
    (``auditlib.config.field_info``): one line of type, default and range per field, then its
    description; an attack's presets follow."""
    from auditlib.attacks import ATTACKS
    from auditlib.attacks.restarts import AUDIT_PRESET
    from auditlib.config import field_info, value_text
    from auditlib.defenses import DEFENSES

    if name in ATTACKS:
        info, kind, option = ATTACKS[name], "attack", "--attack-param"
    elif name in DEFENSES:
        info, kind, option = DEFENSES[name], "defense", "--defense-param"
    else:
        raise AuditInputError(
            f"no attack or defense {name!r}; attacks: {', '.join(sorted(ATTACKS))}; "
            f"defenses: {', '.join(sorted(DEFENSES))}"
        )
    lines = [f"{kind} {name}: {info.summary}"]
    fields = field_info(info.config_type)
    if not fields:
        lines.append("no parameters")
    else:
        lines.append(f"parameters ({option} NAME=VALUE; 'or none': VALUE may be none or empty):")
    for field in fields:
        facts = [field.type + (" or none" if field.optional else "")]
        facts.append(f"default {field.default_text}")
        if field.range_text:
            facts.append(field.range_text)
        lines.append(f"  {field.name}: {'; '.join(facts)}")
        lines.append(_wrapped(field.description, 6))
    presets = getattr(info, "presets", {})
    if presets:
        lines.append(
            _wrapped(
                f"presets (--preset NAME; '{AUDIT_PRESET}' is the default, 'none' the defaults "
                "above; --attack-param overrides a preset's value):",
                0,
            )
        )
        for preset, values in presets.items():
            settings = " ".join(f"{k}={value_text(v)}" for k, v in values.items())
            lines.append(_wrapped(f"{preset}: {settings or '(the defaults)'}", 2))
    return "\n".join(lines)


def params_command(args: argparse.Namespace) -> int:
    from auditlib.attacks import ATTACKS
    from auditlib.defenses import DEFENSES

    if args.name:
        print(params_text(args.name))
        return 0
    print("attacks:")
    for name, info in ATTACKS.items():
        print(f"  {name}: {info.summary}")
    print("defenses:")
    for name, info in DEFENSES.items():
        print(f"  {name}: {info.summary}")
    print("python -m auditlib params NAME lists the parameters of one of them.")
    return 0

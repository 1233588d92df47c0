"""A form for any config dataclass of the library (an attack's or a defense's): one input
per field, its defaults, and the values the user changed (only those go into a spec)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import streamlit as st

from auditlib.config import field_info, optional_inner
from dashboard.state import persist


def config_defaults(config_type: type, overrides: Mapping[str, Any] | None = None) -> dict:
    """Default value of every init field of a config dataclass, with ``overrides`` applied."""
    values = {}
    for f in dataclasses.fields(config_type):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
    values.update(overrides or {})
    return values


def _same_text(text: str, default: Any) -> bool:
    """Whether an optional field's text stands for its default ("30" for 30.0 too)."""
    if text.strip() == str(default):
        return True
    if isinstance(default, int | float) and not isinstance(default, bool):
        try:
            return float(text) == float(default)
        except ValueError:
            return False
    return False


def _three_way_text(value: bool | None) -> str:
    """An optional yes/no field's choice in words: none leaves it to the run."""
    return {None: "the run decides", True: "true", False: "false"}[value]


def changed_params(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The form values that differ from the shown defaults (an empty text stands for None).

    Only these go into the spec, so a run with untouched fields has the same identity as the
    CLI run without parameters.
    """
    changed = {}
    for name, value in values.items():
        default = defaults.get(name)
        if isinstance(value, str) and not isinstance(default, str):
            same = (value.strip() == "" and default is None) or _same_text(value, default)
        else:
            same = value == default
        if not same:
            changed[name] = value
    return changed


def config_inputs(
    config_type: type, key: str, defaults: Mapping[str, Any], exclude: Sequence[str] = ()
) -> dict[str, Any]:
    """One input per field of a config dataclass (but ``exclude``): numbers, choices (the
    field's ``Literal`` values), switches, three-way choices for an optional yes/no (none:
    the run decides), optional numbers.

    Values come back as the widgets give them; ``auditlib.config`` converts and checks them.
    """
    hints = typing.get_type_hints(config_type)
    # Each field's own description as its help: a box named "batch check" says what it does.
    described = {
        i.name: i.description[:1].upper() + i.description[1:] for i in field_info(config_type)
    }
    values: dict[str, Any] = {}
    for f in dataclasses.fields(config_type):
        if not f.init or f.name in exclude:
            continue
        name, annotation, default = f.name, hints[f.name], defaults.get(f.name)
        widget_key = f"{key}.{name}"
        label = name.replace("_", " ")
        about = described.get(name) or None
        if typing.get_origin(annotation) is typing.Literal:
            options = list(typing.get_args(annotation))
            start = default if default in options else options[0]
            values[name] = st.selectbox(
                label, options, help=about, persist_state="session", key=persist(widget_key, start)
            )
        elif annotation is bool:
            values[name] = st.checkbox(
                label, help=about, persist_state="session", key=persist(widget_key, bool(default))
            )
        elif optional_inner(annotation) is bool:
            # Three ways: true, false, or left to the run (none: captured's default).
            values[name] = st.selectbox(
                label,
                [None, True, False],
                format_func=_three_way_text,
                help=about,
                persist_state="session",
                key=persist(widget_key, default),
            )
        elif annotation is int:
            values[name] = int(
                st.number_input(
                    label,
                    step=1,
                    help=about,
                    persist_state="session",
                    key=persist(widget_key, int(default or 0)),
                )
            )
        elif annotation is float:
            values[name] = st.number_input(
                label,
                format="%g",
                help=about,
                persist_state="session",
                key=persist(widget_key, float(default or 0.0)),
            )
        else:
            optional = optional_inner(annotation) is not None
            values[name] = st.text_input(
                f"{label} (optional)" if optional else label,
                help=" ".join(filter(None, [about, "Leave empty for none." if optional else None]))
                or None,
                persist_state="session",
                key=persist(widget_key, "" if default is None else str(default)),
            )
    return values

"""Typed parameter parsing shared by attacks and defenses.

Parameters arrive as strings (CLI ``NAME=VALUE``, form fields) or as Python values (code,
presets). Each attack and defense declares its parameters as a frozen dataclass; this module
turns a mapping into an instance of it, converting and checking every value, and names the
valid keys when one is unknown.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from auditlib.errors import AuditInputError

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_key_values(pairs: list[str] | None, what: str) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``; a pair without '=' is refused."""
    result: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise AuditInputError(f"{what} {pair!r} is not NAME=VALUE")
        if key.strip() in result:
            raise AuditInputError(f"{what} {key.strip()!r} is given twice")
        result[key.strip()] = value.strip()
    return result


def optional_inner(annotation: Any) -> Any | None:
    """``X`` for an ``X | None`` annotation, else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        others = [a for a in args if a is not type(None)]
        if type(None) in args and len(others) == 1:
            return others[0]
    return None


def _convert(value: Any, annotation: Any, owner: str, key: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    inner = optional_inner(annotation)
    if inner is not None:
        if value is None or (isinstance(value, str) and value.lower() in {"none", "null", ""}):
            return None
        return _convert(value, inner, owner, key)
    if origin is typing.Literal:
        text = str(value)
        if text not in [str(a) for a in args]:
            choices = ", ".join(str(a) for a in args)
            raise AuditInputError(f"{owner}: {key}={value!r} is not one of {choices}")
        return next(a for a in args if str(a) == text)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise AuditInputError(f"{owner}: {key}={value!r} is not a yes/no value (true or false)")
    if annotation is int:
        if isinstance(value, bool):
            raise AuditInputError(f"{owner}: {key}={value!r} must be a whole number")
        try:
            number = float(value) if isinstance(value, str) else value
            if isinstance(number, float) and not number.is_integer():
                raise ValueError
            return int(number)
        except (TypeError, ValueError) as exc:
            raise AuditInputError(f"{owner}: {key}={value!r} must be a whole number") from exc
    if annotation is float:
        try:
            number = float(value)
        except (TypeError, ValueError) as exc:
            raise AuditInputError(f"{owner}: {key}={value!r} must be a number") from exc
        if not math.isfinite(number):
            raise AuditInputError(f"{owner}: {key}={value!r} must be a finite number")
        return number
    if annotation is str:
        return str(value)
    raise TypeError(f"unsupported parameter type {annotation!r} for {owner}.{key}")


def build_config(cls: type[T], params: Mapping[str, Any] | None, owner: str) -> T:
    """Instantiate the frozen dataclass ``cls`` from ``params``, converting each value.

    Unknown keys are refused with the list of valid ones; the dataclass's own
    ``__post_init__`` checks ranges.
    """
    params = dict(params or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(params) - set(fields))
    if unknown:
        valid = ", ".join(sorted(fields)) or "none"
        raise AuditInputError(f"{owner} has no parameter {', '.join(unknown)}; valid: {valid}")
    kwargs = {key: _convert(value, hints[key], owner, key) for key, value in params.items()}
    return cls(**kwargs)


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as a JSON-ready dict."""
    return dataclasses.asdict(config)


def require_choice(value: object, allowed: tuple[str, ...], what: str) -> None:
    """Refuse ``value`` unless it is one of ``allowed`` (for Literal fields built in code)."""
    if value not in allowed:
        raise AuditInputError(f"{what} {value!r} is not one of {', '.join(allowed)}")


def require(condition: bool, message: str) -> None:
    """Raise AuditInputError(message) unless condition holds (range checks in configs)."""
    if not condition:
        raise AuditInputError(message)

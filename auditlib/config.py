"""Typed parameters shared by attacks and defenses: declared once, parsed, checked, described.

Each attack and defense declares its parameters as a frozen dataclass whose fields are made
with :func:`param`: the default, a short description and the accepted range (or discrete
values) are written once, beside the field. From that one declaration

- :func:`field_info` describes every field (type, default, range or choices, description)
  for the CLI's ``params`` command and the dashboard's forms;
- :func:`check_ranges`, called from the config's ``__post_init__``, refuses a value outside
  its declared range, whether the config is built in code or by :func:`build_config`;
- :func:`build_config` turns a mapping of strings (CLI ``NAME=VALUE``, form fields) or Python
  values (code, presets) into an instance, converting every value, naming the valid keys
  when one is unknown and the attack or defense when a value is refused.

Rules between fields (``cam_min <= cam_max``) stay in the config's own ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from auditlib.errors import AuditInputError

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


_PARAM = "auditlib.param"  # the key of a field's declaration in its metadata


@dataclasses.dataclass(frozen=True)
class _Declared:
    description: str
    low: float | None
    high: float | None
    low_open: bool
    high_open: bool
    values: tuple[Any, ...]
    identity: bool = True


def param(
    default: Any,
    description: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    values: tuple[Any, ...] = (),
    identity: bool = True,
) -> Any:
    """A config field declared once: its default, a short description and what it accepts.

    ``low``/``high`` bound a number (closed ends unless ``low_open``/``high_open``; either may
    be left out); ``values`` lists the only numbers accepted (bit widths, key sizes). A
    ``Literal`` field's choices come from its type; a ``X | None`` field also accepts None
    (an empty text), which its description says the meaning of. Use as
    ``lr: float = param(0.1, "Adam's step size", low=0, low_open=True, high=10)``.
    ``identity=False``: the field says how a run computes, not what (compiling a step), so a
    run's identity leaves it out (:func:`identity_dict`).
    """
    if not description.strip():
        raise ValueError("a parameter needs a description")
    declared = _Declared(description, low, high, low_open, high_open, tuple(values), identity)
    return dataclasses.field(default=default, metadata={_PARAM: declared})


def _number_text(value: float) -> str:
    """1000 -> "1000", 1e6 -> "1e6", 1e-05 -> "1e-5", 0.5 -> "0.5"."""
    if float(value).is_integer() and abs(value) < 1e6:
        return str(int(value))
    mantissa, _, exponent = f"{value:g}".partition("e")
    return mantissa if not exponent else f"{mantissa}e{int(exponent)}"


def _values_text(values: tuple[Any, ...]) -> str:
    """(1, 2, ..., 8, 16, 32) -> "1-8, 16 or 32": runs of three or more whole numbers joined."""
    parts: list[str] = []
    run: list[Any] = []

    def close() -> None:
        if len(run) >= 3:
            parts.append(f"{_number_text(run[0])}-{_number_text(run[-1])}")
        else:
            parts.extend(_number_text(v) for v in run)
        run.clear()

    for value in values:
        if run and not (isinstance(value, int) and value == run[-1] + 1):
            close()
        run.append(value)
    close()
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} or {parts[-1]}"


def value_text(value: Any) -> str:
    """A parameter value as it is typed back (``NAME=VALUE``, a form's text): true/false, none,
    1e-5 rather than 1e-05."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _number_text(value) if isinstance(value, float) else str(value)
    return str(value)


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """One parameter of an attack's or defense's config, as :func:`param` declared it.

    ``type`` is "float", "int", "bool", "str" or "choice" (a ``Literal``: ``choices`` lists
    its values); ``optional`` fields also take None (an empty text). ``low``/``high`` bound
    a number, each end open or closed; ``choices`` of a number field are the only values it
    takes. ``range_text`` says all of that in words ("in (0, 10]", "> 0", "one of l2,
    cosine"); ``help`` is the description followed by it.
    """

    name: str
    type: str
    default: Any
    description: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[Any, ...] = ()
    optional: bool = False

    @property
    def range_text(self) -> str:
        """What the field accepts, in words; "" when any value of its type is accepted."""
        if self.type == "choice":
            return "one of " + ", ".join(str(c) for c in self.choices)
        if self.choices:
            return _values_text(self.choices)
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {left}{_number_text(self.low)}, {_number_text(self.high)}{right}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_number_text(self.low)}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {_number_text(self.high)}"
        return ""

    @property
    def default_text(self) -> str:
        """The default as it is typed back (``value_text``): "0.1", "true", "none"."""
        return value_text(self.default)

    @property
    def help(self) -> str:
        """The description, then what the field accepts (for a form's tooltip)."""
        accepts = self.range_text
        if self.optional:
            accepts = f"{accepts}, or empty" if accepts else "a value, or empty"
        return f"{self.description} ({accepts})" if accepts else self.description

    @property
    def min_value(self) -> float | None:
        """The lowest value a number widget should offer: the declared bound, one step in
        for an open end of a whole-number field (a float's open end is the bound itself,
        which the check then refuses with its message)."""
        if self.low is None:
            return None
        return self.low + 1 if self.low_open and self.type == "int" else self.low

    @property
    def max_value(self) -> float | None:
        """The highest value a number widget should offer (see :attr:`min_value`)."""
        if self.high is None:
            return None
        return self.high - 1 if self.high_open and self.type == "int" else self.high

    def refusal(self, value: Any) -> str | None:
        """Why ``value`` (already of the field's type) is refused, or None: it is accepted."""
        if value is None and self.optional:
            return None
        if self.type == "choice":
            if value in self.choices:
                return None
            return f"{self.name} {value!r} is not one of {', '.join(str(c) for c in self.choices)}"
        if self.type not in ("int", "float"):
            return None
        inside = (
            value in self.choices
            if self.choices
            else (
                (self.low is None or (value > self.low if self.low_open else value >= self.low))
                and (
                    self.high is None
                    or (value < self.high if self.high_open else value <= self.high)
                )
            )
        )
        if inside:
            return None
        empty = " or empty" if self.optional else ""
        return f"{self.name} must be {self.range_text}{empty}, got {value}"


def _type_text(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return "choice"
    for kind in (bool, int, float, str):
        if annotation is kind:
            return kind.__name__
    raise TypeError(f"unsupported parameter type {annotation!r}")


@functools.cache
def field_info(cls: type) -> tuple[FieldInfo, ...]:
    """Every init field of the config dataclass ``cls``, in declaration order, described."""
    hints = typing.get_type_hints(cls)
    infos = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        annotation = hints[f.name]
        inner = optional_inner(annotation)
        kind = inner if inner is not None else annotation
        declared = f.metadata.get(_PARAM) or _Declared("", None, None, False, False, ())
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        choices = typing.get_args(kind) if _type_text(kind) == "choice" else declared.values
        infos.append(
            FieldInfo(
                name=f.name,
                type=_type_text(kind),
                default=None if default is dataclasses.MISSING else default,
                description=declared.description,
                low=declared.low,
                high=declared.high,
                low_open=declared.low_open,
                high_open=declared.high_open,
                choices=tuple(choices),
                optional=inner is not None,
            )
        )
    return tuple(infos)


def check_ranges(config: Any) -> None:
    """Refuse the first field of ``config`` whose value lies outside its declared range or
    choices (called from each config's ``__post_init__``)."""
    for info in field_info(type(config)):
        message = info.refusal(getattr(config, info.name))
        if message is not None:
            raise AuditInputError(message)


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
    ``__post_init__`` checks ranges (:func:`check_ranges`) and rules between fields, and a
    value it refuses is reported with ``owner`` ("attack ig: lr must be in (0, 10], got 20.0").
    """
    params = dict(params or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(params) - set(fields))
    if unknown:
        valid = ", ".join(sorted(fields)) or "none"
        raise AuditInputError(f"{owner} has no parameter {', '.join(unknown)}; valid: {valid}")
    kwargs = {key: _convert(value, hints[key], owner, key) for key, value in params.items()}
    try:
        return cls(**kwargs)
    except AuditInputError as exc:
        raise type(exc)(f"{owner}: {exc}") from None


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as a JSON-ready dict."""
    return dataclasses.asdict(config)


def identity_dict(config: Any) -> dict[str, Any]:
    """:func:`config_dict` without the fields declared ``identity=False``: what a run of the
    config computes, which its identity hashes."""
    left_out = {
        f.name
        for f in dataclasses.fields(config)
        if not getattr(f.metadata.get(_PARAM), "identity", True)
    }
    return {k: v for k, v in config_dict(config).items() if k not in left_out}


def require_choice(value: object, allowed: tuple[str, ...], what: str) -> None:
    """Refuse ``value`` unless it is one of ``allowed`` (for Literal fields built in code)."""
    if value not in allowed:
        raise AuditInputError(f"{what} {value!r} is not one of {', '.join(allowed)}")


def require(condition: bool, message: str) -> None:
    """Raise AuditInputError(message) unless condition holds (range checks in configs)."""
    if not condition:
        raise AuditInputError(message)

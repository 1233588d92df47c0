"""Parameters declared once (``auditlib.config.param``): every attack and defense field has a
description and a range that takes its default; a value just outside is refused in the same
words whether it comes as a string (CLI, forms) or from code; the CLI lists them."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal, get_args

import pytest

from auditlib.attacks import ATTACKS
from auditlib.attacks.inverting_gradients import InvertingGradientsConfig
from auditlib.cli import build_parser, main
from auditlib.config import FieldInfo, build_config, check_ranges, field_info, param, value_text
from auditlib.defenses import DEFENSES
from auditlib.defenses.dp_noise import GaussianNoiseConfig
from auditlib.errors import AuditInputError

COMPONENTS = [("attack", name, info.config_type) for name, info in ATTACKS.items()] + [
    ("defense", name, info.config_type) for name, info in DEFENSES.items()
]
IDS = [f"{kind} {name}" for kind, name, _ in COMPONENTS]


def _bounded_fields():
    for kind, name, config_type in COMPONENTS:
        for info in field_info(config_type):
            if info.type in ("int", "float") and (
                info.low is not None or info.high is not None or info.choices
            ):
                yield pytest.param(kind, name, config_type, info, id=f"{name}.{info.name}")


def _outside(info: FieldInfo) -> list[float]:
    """Values just outside the declared range: the open ends themselves, a step past the
    closed ones (one for whole numbers, a relative hair for floats)."""
    if info.choices:
        return [max(info.choices) + 1, min(info.choices) - 1]
    values = []
    for bound, is_open, sign in ((info.low, info.low_open, -1), (info.high, info.high_open, 1)):
        if bound is None:
            continue
        if is_open:
            values.append(bound if info.type == "float" else int(bound))
        elif info.type == "int":
            values.append(int(bound) + sign)
        else:
            values.append(bound + sign * max(abs(bound) * 1e-9, 1e-12))
    return values


def _text(value: float, kind: str) -> str:
    return str(int(value)) if kind == "int" else repr(float(value))


@pytest.mark.parametrize(("kind", "name", "config_type"), COMPONENTS, ids=IDS)
def test_every_field_is_described_and_its_range_takes_its_default(kind, name, config_type):
    infos = field_info(config_type)
    assert [i.name for i in infos] == list(config_type.__dataclass_fields__)
    for info in infos:
        assert info.description.strip(), f"{kind} {name}: {info.name} has no description"
        assert info.refusal(info.default) is None, (name, info.name, info.default)
        if info.type == "choice":
            assert info.default in info.choices
    config_type()  # the defaults pass every check, declared and cross-field


@pytest.mark.parametrize(("kind", "name", "config_type", "info"), list(_bounded_fields()))
def test_a_value_just_outside_the_declared_range_is_refused_naming_field_and_range(
    kind, name, config_type, info
):
    for value in _outside(info):
        expected = f"{info.name} must be {info.range_text}"
        with pytest.raises(AuditInputError) as refused:
            build_config(config_type, {info.name: _text(value, info.type)}, f"{kind} {name}")
        message = str(refused.value)
        assert message.startswith(f"{kind} {name}: {expected}"), message
        assert len(message.splitlines()) == 1
        # The same check holds for a config built in code, in the same words.
        with pytest.raises(AuditInputError, match=f"^{re.escape(expected)}"):
            config_type(**{info.name: value})


@pytest.mark.parametrize(("kind", "name", "config_type", "info"), list(_bounded_fields()))
def test_the_closed_ends_of_a_range_are_not_refused_by_it(kind, name, config_type, info):
    ends = list(info.choices) or [
        bound
        for bound, is_open in ((info.low, info.low_open), (info.high, info.high_open))
        if bound is not None and not is_open
    ]
    for value in ends:
        try:
            build_config(config_type, {info.name: _text(value, info.type)}, f"{kind} {name}")
        except AuditInputError as exc:  # only a rule between fields may refuse it
            assert f"{info.name} must be" not in str(exc), str(exc)


def test_the_messages_keep_their_words():
    cases = [
        ("ig", {"lr": "20"}, "attack ig: lr must be in (0, 10], got 20.0"),
        ("grnn", {"tv": "11"}, "attack grnn: tv must be in [0, 10] or empty, got 11.0"),
        ("grnn", {"momentum": "1"}, "attack grnn: momentum must be in [0, 1), got 1.0"),
        ("dlg", {"restarts": "65"}, "attack dlg: restarts must be in [1, 64], got 65"),
    ]
    for name, params, message in cases:
        with pytest.raises(AuditInputError) as refused:
            build_config(ATTACKS[name].config_type, params, f"attack {name}")
        assert str(refused.value) == message
    defense_cases = [
        ("quantize", {"bits": "9"}, "defense quantize: bits must be 1-8, 16 or 32, got 9"),
        ("dp-gaussian", {"clip": "0"}, "defense dp-gaussian: clip must be > 0 or empty, got 0.0"),
        ("fedboosting", {"scale": "1e61"}, "scale must be in [1, 1e60]"),
        ("clip", {"bound": "2e6"}, "bound must be in (0, 1e6]"),
        ("outpost", {"beta": "-1"}, "beta must be >= 0, got -1.0"),
        ("fedboosting", {"key_bits": "100"}, "key_bits must be 128, 256, 512, 1024, 2048"),
    ]
    for name, params, message in defense_cases:
        with pytest.raises(AuditInputError, match=re.escape(message)):
            build_config(DEFENSES[name].config_type, params, f"defense {name}")


def test_rules_between_fields_still_hold():
    with pytest.raises(AuditInputError, match="odd window from 3 to 15"):
        build_config(ATTACKS["fedleak"].config_type, {"median_filter": "1"}, "attack fedleak")
    with pytest.raises(AuditInputError, match="odd window from 3 to 15"):
        build_config(ATTACKS["fedleak"].config_type, {"median_filter": "4"}, "attack fedleak")
    build_config(ATTACKS["fedleak"].config_type, {"median_filter": "15"}, "attack fedleak")
    with pytest.raises(AuditInputError, match="defense shadow: expected 0 <= cam_min <= cam_max"):
        build_config(DEFENSES["shadow"].config_type, {"cam_min": "0.6"}, "defense shadow")
    with pytest.raises(AuditInputError, match="trusted party"):
        build_config(GaussianNoiseConfig, {"sample_rate": "0.5"}, "defense dp-gaussian")


def test_field_info_of_a_literal_field_lists_its_choices():
    ig = {i.name: i for i in field_info(InvertingGradientsConfig)}
    assert ig["distance"].type == "choice"
    assert ig["distance"].choices == ("cosine", "l2")
    assert ig["distance"].range_text == "one of cosine, l2"
    assert ig["labels"].choices == ("auto", "known", "idlg", "joint")
    # Through a type alias (Neighbours) too; and an optional number is marked so.
    dp = {i.name: i for i in field_info(GaussianNoiseConfig)}
    assert dp["neighbours"].choices == ("replace-one", "client-present")
    assert dp["clip"].type == "float" and dp["clip"].optional and dp["clip"].range_text == "> 0"
    assert dp["delta"].range_text == "in (0, 1)"
    assert "(in (0, 1))" in dp["delta"].help
    assert dp["sigma"].help.startswith(dp["sigma"].description)
    # A Literal value outside its choices is refused in code as well as from text.
    with pytest.raises(AuditInputError, match="distance 'l3' is not one of cosine, l2"):
        InvertingGradientsConfig(distance="l3")  # type: ignore[arg-type]
    with pytest.raises(AuditInputError, match="distance='l3' is not one of cosine, l2"):
        build_config(InvertingGradientsConfig, {"distance": "l3"}, "attack ig")


def test_widget_bounds_and_texts():
    @dataclass(frozen=True)
    class Example:
        steps: int = param(5, "steps", low=0, low_open=True, high=10, high_open=True)
        rate: float = param(0.5, "rate", low=0, low_open=True, high=1)
        bits: int = param(8, "bits", values=(1, 2, 3, 4, 8))
        mode: Literal["a", "b"] = param("a", "mode")
        free: float = param(0.0, "unbounded")

        def __post_init__(self) -> None:
            check_ranges(self)

    info = {i.name: i for i in field_info(Example)}
    assert (info["steps"].min_value, info["steps"].max_value) == (1, 9)
    assert (info["rate"].min_value, info["rate"].max_value) == (0, 1)
    assert info["bits"].range_text == "1-4 or 8"
    assert info["free"].range_text == "" and info["free"].help == "unbounded"
    assert info["mode"].choices == get_args(Literal["a", "b"])
    with pytest.raises(AuditInputError, match=r"^steps must be in \(0, 10\), got 10$"):
        Example(steps=10)
    with pytest.raises(AuditInputError, match=r"^rate must be in \(0, 1\], got nan$"):
        Example(rate=math.nan)
    assert [value_text(v) for v in (None, True, 1e-5, 1e32, 30.0, 7, "x")] == [
        "none",
        "true",
        "1e-5",
        "1e32",
        "30",
        "7",
        "x",
    ]
    with pytest.raises(ValueError, match="description"):
        param(1, " ")


def test_the_params_command_prints_each_field_with_its_range_and_description(capsys):
    assert main(["params", "dp-gaussian"]) == 0
    out = capsys.readouterr().out
    sigma = next(i for i in field_info(GaussianNoiseConfig) if i.name == "sigma")
    assert "  sigma: float; default 0.1; in [0, 1000]" in out
    assert sigma.description in out
    assert "  clip: float or none; default 30; > 0" in out
    assert "neighbours: choice; default replace-one; one of replace-one, client-present" in out

    assert main(["params", "ig"]) == 0
    out = capsys.readouterr().out
    assert "  lr: float; default 0.1; in (0, 10]" in out
    assert "presets" in out and "audit: " in out and "restarts=4" in out

    assert main(["params"]) == 0
    out = capsys.readouterr().out
    assert "attacks:" in out and "  fedleak: " in out and "  dp-laplace: " in out


def test_params_of_an_unknown_name_is_one_line_naming_the_valid_ones(capsys):
    assert main(["params", "walls"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no attack or defense 'walls'")
    assert "dp-gaussian" in err[0] and "fedleak" in err[0]


def _choices(parser, command: str, option: str):
    sub = next(a for a in parser._subparsers._group_actions if a.choices).choices[command]
    return tuple(next(a for a in sub._actions if option in a.option_strings).choices)


def test_the_cli_takes_its_choices_and_param_help_from_the_definitions():
    from auditlib.client.protocol import Algorithm, BatchNormMode, Shared
    from auditlib.fl.federation import Split
    from auditlib.models.architectures import ACTIVATIONS, STEMS
    from auditlib.models.registry import INITS
    from auditlib.spec import UTILITY_DATASETS

    parser = build_parser()
    assert _choices(parser, "audit", "--scenario") == get_args(Algorithm)
    assert _choices(parser, "audit", "--share") == get_args(Shared)
    assert _choices(parser, "audit", "--bn-mode") == get_args(BatchNormMode)
    assert _choices(parser, "audit", "--pretrain-data") == UTILITY_DATASETS
    assert _choices(parser, "audit", "--init") == INITS
    assert _choices(parser, "utility", "--activation") == ACTIVATIONS
    assert _choices(parser, "utility", "--stem") == STEMS
    assert _choices(parser, "utility", "--split") == get_args(Split)
    sub = next(a for a in parser._subparsers._group_actions if a.choices).choices
    for command, option in (
        ("audit", "--attack-param"),
        ("audit", "--defense-param"),
        ("utility", "--defense-param"),
    ):
        action = next(a for a in sub[command]._actions if option in a.option_strings)
        assert "python -m auditlib params" in action.help

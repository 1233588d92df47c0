"""``python -m auditlib models``: the architectures ``--model`` takes: the built-ins, with
what each is, every torchvision classification model (``torchvision:NAME``), by family, and
how to name a model class of your own code."""

from __future__ import annotations

import argparse
import itertools
import re
import textwrap


def _wrapped(text: str, indent: int) -> str:
    return textwrap.fill(
        text,
        width=100,
        initial_indent=" " * indent,
        subsequent_indent=" " * (indent + 4),
        break_on_hyphens=False,
    )


def _family(name: str) -> str:
    match = re.match(r"(wide_)?[a-z]+", name)
    return match.group(0) if match else name


def models_text() -> str:
    """The built-in architectures (name: description) and the torchvision names grouped by
    family, with what a torchvision model takes and which have no BatchNorm."""
    from auditlib.models import ARCHITECTURES
    from auditlib.models.zoo import (
        DEFAULT_SIDE,
        PREFIX,
        ends_in_linear,
        has_batchnorm,
        torchvision_names,
    )

    lines = ["built-in architectures (--model NAME):"]
    lines += [_wrapped(f"{name}: {info.description}", 2) for name, info in ARCHITECTURES.items()]
    names = torchvision_names()
    lines.append(
        _wrapped(
            f"torchvision classification models (--model {PREFIX}NAME; {len(names)} names): "
            "random init from the builder (weights=None; nothing is downloaded) or the "
            "auditor's --weights; colour input (--channels 3); dropout and stochastic depth "
            f"off; made for {DEFAULT_SIDE}x{DEFAULT_SIDE} pixels, other sizes where the "
            "architecture takes them (ViT: square, a multiple of its patch size, the name's "
            "last number; maxvit_t: 224 or 448; the refusal of a size names the smallest "
            "one a model takes). Names marked * have no BatchNorm, so GradInversion "
            "runs without its BatchNorm prior:",
            0,
        )
    )
    for family, members in itertools.groupby(names, key=_family):
        members = list(members)
        marked = [m + ("" if has_batchnorm(m) else "*") for m in members]
        lines.append(_wrapped(f"{family}: {', '.join(marked)}", 2))
    conv_head = [n for n in names if not ends_in_linear(n)]
    lines.append(
        _wrapped(
            f"{' and '.join(conv_head)} end in a 1x1 convolution, not a linear layer: the "
            "attacks that read the labels from the last linear layer's gradient cannot run "
            "against them.",
            0,
        )
    )
    lines.append(
        _wrapped(
            "a model class of your own code (--model path/to/file.py:ClassName, its "
            "constructor's arguments as --model-args JSON; in a bundle's training.json: model "
            "and model_args): importing the file runs it, so it is built only with "
            "--i-trust-this-file, in a process of its own (docs/FLOWER.md)",
            0,
        )
    )
    return "\n".join(lines)


def models_command(args: argparse.Namespace) -> int:
    print(models_text())
    return 0

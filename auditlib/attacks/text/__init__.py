"""Attacks on text models' updates: each paper a function of the server's knowledge
(``TextTarget``) and a typed config, giving recovered sequences (``RecoveredText``).

The catalogue says what each needs (labels known, which updates it reads) so the engine
offers an attack only where its paper's threat model holds, and says why otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from auditlib.attacks.text.base import OnProgress, RecoveredText, StopCheck, TextTarget
from auditlib.attacks.text.dager import DagerConfig, run_dager
from auditlib.attacks.text.lamp import LampConfig, run_lamp
from auditlib.attacks.text.tag import TagConfig, run_tag
from auditlib.attacks.text.tiger import TigerConfig, run_tiger
from auditlib.attacks.text.utr import UtrConfig, run_utr


@dataclass(frozen=True)
class TextAttackInfo:
    name: str
    title: str  # the paper, in words
    run: Callable[..., RecoveredText]  # run(target, config, on_progress, should_stop)
    config: type
    full_update: bool  # reads an update of every weight
    adapters_update: bool  # reads an update of LoRA adapters alone
    exact: bool  # recovers tokens exactly where its assumptions hold


TEXT_ATTACKS: dict[str, TextAttackInfo] = {
    "dager": TextAttackInfo(
        "dager", "DAGER (Petrov et al., NeurIPS 2024)", run_dager, DagerConfig, True, True, True
    ),
    "tag": TextAttackInfo(
        "tag", "TAG (Deng et al., Findings of EMNLP 2021)", run_tag, TagConfig, True, True, False
    ),
    "lamp": TextAttackInfo(
        "lamp", "LAMP (Balunovic et al., NeurIPS 2022)", run_lamp, LampConfig, True, True, False
    ),
    "tiger": TextAttackInfo(
        "tiger",
        "TIGER's continuous span objective (after Kalikman et al., arXiv 2606.18312, 2026; "
        "from its abstract, docs/ALGORITHMS.md)",
        run_tiger,
        TigerConfig,
        True,
        False,
        False,
    ),
    "utr": TextAttackInfo(
        "utr",
        "UTR's ideas for LoRA adapters (after Chen et al., arXiv 2601.17533, 2026; derived, "
        "docs/ALGORITHMS.md)",
        run_utr,
        UtrConfig,
        False,
        True,
        False,
    ),
}


def run_text_attack(
    name: str,
    target: TextTarget,
    config=None,
    on_progress: OnProgress | None = None,
    should_stop: StopCheck | None = None,
) -> RecoveredText:
    """Attack ``name`` on ``target``; ``should_stop`` is read between its steps (a Cancel),
    and the attack then returns what it had (``RecoveredText.stopped``)."""
    info = TEXT_ATTACKS[name]
    kwargs = {} if on_progress is None else {"on_progress": on_progress}
    if should_stop is not None:
        kwargs["should_stop"] = should_stop
    return info.run(target, config if config is not None else info.config(), **kwargs)

"""Improved DLG (Zhao, Mopuri, Bilen 2020): the label from the last layer, then DLG on images.

The label of a single image is read off the last layer's update (``attacks.labels``); the
dummy image alone is then optimised with L-BFGS (lr 1) against the L2 update distance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from auditlib.attacks.base import AttackInfo, AuditPreset, RunControl, register
from auditlib.attacks.compiled import apart_when_compiled
from auditlib.attacks.dlg import (
    LBFGS_TWIN,
    LBFGS_TWIN_WHY,
    LbfgsConfig,
    run_lbfgs_attack,
    run_lbfgs_updates,
)
from auditlib.attacks.labels import idlg_label, why_not_one_image
from auditlib.config import param


@dataclass(frozen=True)
class IdlgConfig(LbfgsConfig):
    label_source: Literal["weight", "bias"] = param(
        "weight",
        "last-layer update the label is read from: the weight rows' sums (iDLG) or the bias",
    )


def run_idlg(observation, knowledge, config: IdlgConfig, control: RunControl, seed: int):
    label, inference = idlg_label(observation, knowledge, config.label_source)
    labels = torch.tensor([label], dtype=torch.long)
    return run_lbfgs_attack(
        "idlg", observation, knowledge, config, control, seed, labels, inference
    )


def run_idlg_updates(observations, knowledges, config: IdlgConfig, control, seeds):
    """iDLG on several updates together (``AttackInfo.run_updates``): each update's label
    read off its own last layer, its starts matching its own update."""
    read = [
        idlg_label(o, k, config.label_source) for o, k in zip(observations, knowledges, strict=True)
    ]
    labels = [torch.tensor([label], dtype=torch.long) for label, _ in read]
    inferences = [inference for _, inference in read]
    return run_lbfgs_updates(observations, knowledges, config, control, seeds, labels, inferences)


register(
    AttackInfo(
        name="idlg",
        summary="iDLG (Zhao et al. 2020): analytic label from the last layer, then L-BFGS on the image.",
        config_type=IdlgConfig,
        run=run_idlg,
        run_updates=run_idlg_updates,
        why_updates_apart=apart_when_compiled("idlg"),
        not_applicable=why_not_one_image,
        presets={
            "paper": {"lr": 1.0, "lbfgs_max_iter": 20, "restarts": 1, "label_source": "weight"}
        },
        audit=AuditPreset(
            {"lr": 1.0, "lbfgs_max_iter": 20, "restarts": 8, "label_source": "weight"},
            iterations=300,
            why="iDLG's settings with DLG's cure for bad starts: 8 starts race, the lowest gradient distance wins",
        ),
        paper_iterations=300,
        twin_params=LBFGS_TWIN,
        twin_why=LBFGS_TWIN_WHY,
    )
)

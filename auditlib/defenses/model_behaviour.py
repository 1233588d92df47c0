"""The model check's behaviour signals: what the received model does on the client's own batch
before the client trains on it, whatever its activations and whether a layer is a Linear or
a convolution.

The weight signatures (``model_signatures``) look for the structure the published blocks
are built from, which a server that knows them can jitter away (issue 54: rows jittered
20 %, bins as a full-image convolution, trap magnitudes perturbed by 0.1 %). What a
malicious model cannot give up without giving up the attack is its behaviour: the update
must hold single images, which means that on the client's batch some layer's units each
take their gradient from one image alone (trap rows) or from nested sets of images (an
imprint's bins: each bin's images contain the next bin's, and an image is read back as the
difference of two neighbours). Both are read from each image's own weight gradient at each
unit (``model_behaviour_grads``: one backward pass of the client's summed loss). A third
signal is SEER's disaggregation SNR: one image's gradient at a layer against the rest's.

Each signal is computed per layer; a layer is flagged when it crosses its threshold (named
below with why it sits where it does). ``benchmarks/model_check_rates.py`` records the
values honest models reach and the error rates on honest and malicious models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from auditlib.defenses.model_behaviour_grads import BatchGradients, LayerGradients, batch_gradients
from auditlib.defenses.model_signatures import Finding

# Fewer images than this and an honest ReLU unit is fired by one image alone too often (at
# 2 images half the firing units are; at 4, about a quarter; at 8, 3 %): the behaviour
# signals are not judged below it.
MIN_BATCH = 4
# A layer is judged only with this many units with a gradient (a head of 10 classes is).
MIN_UNITS = 8
# Ownership (after Boenisch et al.'s trap weights, "When the Curious Abandon Honesty",
# EuroS&P 2023, and Carletti et al. 2025's per-sample gradient dynamics): a unit is owned by
# image i when i's share of the unit's gradient is at least OWNED. The attack reads image i
# back from such a row with a relative error of about the others' share, so 0.9 keeps every
# unit that reads back at 20 dB or better.
OWNED = 0.9
# A layer is flagged when this share of its units with a gradient are owned. An honest ReLU
# unit at initialisation fires for about half the images (owned with chance B 2^-B: 25 %
# at 4 images, 3 % at 8; more where the images are alike); trap rows tuned to fire for one
# image in B are owned far more often. Measured on honest models: see the benchmark.
OWNERSHIP = 0.5
# Chain by inclusion (Robbing the Fed's imprint, Fowl et al. ICLR 2022; LOKI, Zhao et al.
# S&P 2024). A unit splits the batch when, its images' shares of its gradient sorted (each
# image's gradient first scaled to one over the layer, so one image's loss does not make it
# big everywhere), they fall by GAP or more: a unit off for an image gives it a zero (ReLU,
# clamp, threshold) or its slope (leaky: 0.01). An honest unit after a smooth activation or
# a convolution's channel, reached by every image through some position, falls by less.
# Bins are nested: every unit's images are the first k of one order of the images (the
# order by how many units each reaches), so the difference of two neighbours is one image.
GAP = 10.0
# A layer is flagged when this share of all its units with a gradient split the batch into
# such first-k sets (at least MIN_UNITS of them, spanning at least CHAIN_SIZES different k).
# A random subset of 8 images (an honest ReLU unit) is one with chance about 3 %; an honest
# convolution's channel is reached by every image through some position and rarely splits
# (the honest layers below split at most a quarter of their channels, and their channels'
# sets follow one order at most 94 % of the time at 4 images); an imprint's bins split the
# batch all but those below its darkest image (86-93 % at 4-16 images, all first-k).
CHAIN = 0.5
CHAIN_SIZES = 3
# SEER's disaggregation SNR (Garov et al., ICLR 2024, "Hiding in Plain Sight", Sec. 6;
# ``insait-institute/SEER`` ``detectability/detectability.py``): per layer, the largest
# per-image weight-gradient norm over the sum of the others'. Equal images give 1/(B-1); a
# model that makes one image's gradient dominate a layer (SEER's disguised decoder) gives
# several. Trained honest models reach high values when one image of the batch is misclassified,
# so it is flagged only above DSNR (measured: see the benchmark and docs/ALGORITHMS.md).
DSNR = 20.0


@dataclass(frozen=True)
class LayerBehaviour:
    """The behaviour statistics of one layer on the client's batch."""

    name: str
    kind: str
    units: int  # units with a gradient
    ownership: float  # the share of units with a gradient that one image owns
    chain: float  # the share of splitting units whose images are first-k of one order
    chain_sizes: int  # distinct k among them
    dsnr: float  # SEER's disaggregation SNR


@dataclass(frozen=True)
class BehaviourThresholds:
    ownership: float = OWNERSHIP
    chain: float = CHAIN
    dsnr: float = DSNR


@dataclass(frozen=True)
class Behaviour:
    layers: tuple[LayerBehaviour, ...]
    skipped: tuple[str, ...]
    why_unavailable: str  # "" where the batch was judged


def scaled_per_image(per_unit: torch.Tensor) -> torch.Tensor:
    """Each image's per-unit norms over their sum: its gradient's distribution over units
    (an image with no gradient at the layer stays zero)."""
    total = per_unit.sum(1, keepdim=True)
    return torch.where(total > 0, per_unit / total.clamp_min(1e-300), 0)


def ownership(per_unit: torch.Tensor) -> float:
    """The share of the layer's units with a gradient that one image owns (holds at least
    OWNED of the unit's gradient, each image's gradient first scaled to one over the
    layer)."""
    share = scaled_per_image(per_unit)
    total = share.sum(0)
    live = total > 0
    if not bool(live.any()):
        return 0.0
    owned = live & (share.max(0).values >= OWNED * total)
    return float(owned.sum()) / float(live.sum())


def unit_sets(per_unit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each unit's images (images x units, boolean), and whether the unit splits the images
    cleanly: sorted, its images' scaled shares fall by a factor of GAP or more somewhere
    (a unit switched off gives a zero, an infinite fall; a leaky or smooth off its slope),
    and its images are those above the largest fall. Units with no such fall do not split."""
    share = scaled_per_image(per_unit)
    ordered, order = share.sort(0, descending=True)
    ratio = ordered[:-1] / ordered[1:].clamp_min(1e-300)
    ratio = torch.where(ordered[:-1] > 0, ratio, 0)  # below the last live image: no fall
    fall, at = ratio.max(0)
    split = fall >= GAP
    rank = torch.empty_like(order)
    rank.scatter_(0, order, torch.arange(len(share))[:, None].expand_as(order))
    member = rank <= at[None, :]
    return member & split[None, :], split


def chain(per_unit: torch.Tensor) -> tuple[float, int]:
    """The share of the layer's units with a gradient that split the images cleanly into the
    first k of one order (the order by how many splitting units each image belongs to); and
    how many distinct k below the batch they span. 0 where fewer than MIN_UNITS split."""
    live = int((per_unit.sum(0) > 0).sum())
    member, split = unit_sets(per_unit)
    member = member[:, split]
    if member.shape[1] < MIN_UNITS:
        return 0.0, 0
    reach = member.sum(1).double()  # units each image belongs to
    inside = torch.where(member, reach[:, None], torch.inf).min(0).values
    outside = torch.where(~member, reach[:, None], -torch.inf).max(0).values
    first_k = inside >= outside  # every member reaches at least as many units as any other
    sizes = member.sum(0)[first_k]
    distinct = len(torch.unique(sizes[sizes < member.shape[0]]))
    return float(first_k.sum()) / live, distinct


def dsnr(per_image: torch.Tensor) -> float:
    """SEER's D-SNR of one layer: the largest per-image norm over the sum of the rest."""
    if per_image.numel() < 2:
        return 0.0
    largest = per_image.max()
    rest = per_image.sum() - largest
    return float(largest / rest) if float(rest) > 0 else float("inf")


def model_dsnr(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """SEER's D-SNR of ``model`` on the batch: the largest over its layers (0 where the
    batch is too small to judge, ``MIN_BATCH``)."""
    return max((layer.dsnr for layer in behaviour(model, images, labels).layers), default=0.0)


def layer_behaviour(layer: LayerGradients) -> LayerBehaviour:
    """A layer's statistics; the head's units are the classes, which the labels split and
    own (an image's label owns its class's unit): ownership and chain are not read there."""
    units = int((layer.per_unit.sum(0) > 0).sum())
    ratio, sizes = (0.0, 0) if layer.head else chain(layer.per_unit)
    return LayerBehaviour(
        layer.name,
        layer.kind,
        units,
        0.0 if layer.head else ownership(layer.per_unit),
        ratio,
        sizes,
        dsnr(layer.per_image),
    )


def behaviour(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, mode: str = "eval"
) -> Behaviour:
    """The behaviour statistics of every judged layer of ``model`` on the client's batch."""
    if images.shape[0] < MIN_BATCH:
        return Behaviour(
            (),
            (),
            f"a batch of {images.shape[0]} images; the behaviour signals need {MIN_BATCH} or more",
        )
    found: BatchGradients = batch_gradients(model, images, labels, mode)
    if found.why_unavailable:
        return Behaviour((), found.skipped, found.why_unavailable)
    layers = tuple(
        layer_behaviour(layer)
        for layer in found.layers
        if int((layer.per_unit.sum(0) > 0).sum()) >= MIN_UNITS
    )
    return Behaviour(layers, found.skipped, "")


def behaviour_findings(
    seen: Behaviour, thresholds: BehaviourThresholds = BehaviourThresholds()
) -> list[Finding]:
    """The layers whose behaviour crosses a threshold, each as a Finding in words."""
    findings = []
    for layer in seen.layers:
        if layer.ownership >= thresholds.ownership:
            findings.append(
                Finding(
                    "ownership",
                    layer.name,
                    f"layer {layer.name}: on this batch one image alone gives {OWNED:.0%} or "
                    f"more of the gradient of {layer.ownership:.0%} of its units: the update "
                    "holds single images (trap rows)",
                    layer.ownership,
                )
            )
        if layer.chain >= thresholds.chain and layer.chain_sizes >= CHAIN_SIZES:
            findings.append(
                Finding(
                    "chain",
                    layer.name,
                    f"layer {layer.name}: on this batch {layer.chain:.0%} of the units that "
                    f"split the images hold nested sets of them ({layer.chain_sizes} sizes), "
                    "bins whose differences isolate single images (an imprint)",
                    layer.chain,
                )
            )
        if layer.dsnr >= thresholds.dsnr:
            findings.append(
                Finding(
                    "dsnr",
                    layer.name,
                    f"layer {layer.name}: one image's weight gradient is {layer.dsnr:.3g} times "
                    "the others' together (SEER's disaggregation SNR)",
                    layer.dsnr,
                )
            )
    return findings

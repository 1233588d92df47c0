"""The client's images checked against its update: the client's training replayed on them.

Where the update is a deterministic function of the global model, the images, their labels
and training.json (FedSGD, or local training without shuffling), the server's side can run
that training itself and compare. The images that produce the update are the client's; any
other set (another client's, a wrong order for several mini-batches, wrong labels) does not,
and nor do the right images under a training training.json misstates (an assumed momentum).

The distance, per trainable tensor, is ``||replayed - observed|| / ||observed||`` of the
update as a change (the gradient for FedSGD, client - global otherwise). A match is every
tensor within :data:`TOLERANCE`: float rounding (other kernels, another summation order, a
framework's SGD step against this one's) stays orders of magnitude below it, and another
image set lands near 1.

From a folder with more images than the client trained on, the subsets (in the folder's
order) are replayed until one matches, up to :data:`MAX_SUBSETS`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from auditlib.client.update import client_update
from auditlib.observed.bundle import ObservedBundle

TOLERANCE = 1e-3  # the largest relative distance of a tensor that still matches
MAX_SUBSETS = 500  # replays tried to find the client's images in a larger folder


@dataclass(frozen=True)
class Replay:
    """One replay of the client's training on a set of images: which ones (positions in the
    given folder), each tensor's relative distance to the observed update, and whether all
    are within :data:`TOLERANCE`."""

    picked: tuple[int, ...]
    distances: tuple[tuple[str, float], ...]

    @property
    def largest(self) -> float:
        return max(d for _, d in self.distances)

    @property
    def matches(self) -> bool:
        return self.largest <= TOLERANCE

    def to_json(self) -> dict[str, object]:
        return {
            "picked": list(self.picked),
            "largest_relative_distance": self.largest,
            "tolerance": TOLERANCE,
            "matches": self.matches,
            "relative_distance_per_tensor": dict(self.distances),
        }


@dataclass(frozen=True)
class ImageCheck:
    """What the replay found: ``replay`` the matching one (or the closest), ``tried`` how
    many subsets were replayed, or ``skipped`` why none could be."""

    replay: Replay | None
    tried: int = 0
    skipped: str | None = None

    @property
    def matches(self) -> bool:
        return self.replay is not None and self.replay.matches

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"tried": self.tried, "skipped": self.skipped}
        if self.replay is not None:
            out |= self.replay.to_json()
        return out


def why_not_replayable(bundle: ObservedBundle, labels_given: bool) -> str | None:
    """Why the update cannot be replayed (None where it can)."""
    if not labels_given:
        return (
            "the images carry no labels (labels.csv or class folders): the update depends on "
            "them, so it is not replayed"
        )
    if bundle.training.shuffled and not bundle.training.one_gradient:
        return "the client shuffled its mini-batches in an order the server does not know"
    return None


def _observed_change(bundle: ObservedBundle, names: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
    if bundle.protocol.algorithm == "fedsgd":
        return bundle.observed_update(names)[1]
    return bundle.weight_change(names)


def replay(
    bundle: ObservedBundle,
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    picked: Sequence[int],
) -> Replay:
    """The client's training replayed on ``images[picked]`` from the bundle's global model,
    compared with the update it sent."""
    parameters = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    names = tuple(parameters)
    protocol = bundle.protocol
    if protocol.algorithm != "fedsgd":  # compared as the change, whatever was sent
        protocol = dataclasses.replace(protocol, shared="delta")
    index = torch.tensor(list(picked), dtype=torch.long)
    device = next(iter(parameters.values())).device
    training = model.training  # client_update sets the mode the client trained in
    try:
        replayed = client_update(
            model,
            parameters,
            images[index].to(device),
            labels[index].to(device),
            protocol,
            differentiable=False,
        )
    finally:
        model.train(training)
    observed = _observed_change(bundle, names)
    distances = []
    for name, ours, theirs in zip(names, replayed, observed, strict=True):
        theirs = theirs.to(ours.device, ours.dtype)
        scale = float(theirs.norm())
        gap = float((ours - theirs).norm())
        distances.append((name, gap / scale if scale > 0 else (0.0 if gap == 0 else math.inf)))
    return Replay(tuple(picked), tuple(distances))


def check_images(
    bundle: ObservedBundle, model: nn.Module, images: torch.Tensor, labels: torch.Tensor
) -> ImageCheck:
    """The client's images among ``images``: all of them where they are as many as the
    client trained on, else the first subset (in order) whose replay matches; the closest
    replay where none does."""
    count, wanted = int(images.shape[0]), bundle.training.num_examples
    subsets = itertools.combinations(range(count), wanted)
    best: Replay | None = None
    tried = 0
    for picked in itertools.islice(subsets, MAX_SUBSETS):
        tried += 1
        found = replay(bundle, model, images, labels, picked)
        if found.matches:
            return ImageCheck(found, tried)
        if best is None or found.largest < best.largest:
            best = found
    return ImageCheck(best, tried)

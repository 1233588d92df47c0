"""SEER's joint training of the shared model and its secret decoder (``server.disguise``).

Garov, Dimitrov, Jovanović, Vechev, "Hiding in Plain Sight: Disguising Data Stealing Attacks
in Federated Learning" (ICLR 2024). The decoder is linear up to its output bias (its
disaggregator has no bias), so it maps the sum of the batch's per-image gradients to the sum
of what it maps each to. Each step sorts a public batch by the secret property and asks of
three weighted gradients of the batch (SEER's ``jac`` columns; the batch drawn at random,
SEER's ``prop_mode max``, or with one image above the property's threshold, its ``thresh``
mode's positive batches: ``batch_drawer``):

- the top image's gradient alone decodes to that image (the positive term);
- the sum of the other images' gradients, and a random unit combination of them, decode to
  what the zero update decodes to (the negative term), so they vanish from a sum.

The two terms are weighed alpha : 1 with log2 alpha rising linearly from -2 to log2 of the
images per update over the first half of the steps (SEER's ``rat_sched`` defaults), and the
model's weights and the decoder take Adam steps together, one batch per step (SEER
accumulates 10). Two departures to learn in minutes: the reconstructor's bias starts at the
public mean of the property's top image (the guess; SEER starts from PyTorch's init) and its
weights at 1 % of theirs. Nothing else constrains the model:
SEER adds no task loss, so its accuracy is whatever the training leaves (measured and
reported, ``TrainingOutcome``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

# Held-out public batches the build scores its decoder on.
HELD_OUT_BATCHES = 32
# SEER's ``sched_y_1``: log2 of the negative term's weight at the first step.
ALPHA_START_LOG2 = -2.0


@dataclass(frozen=True)
class PublicSet:
    """Public images the server holds: ``pixels`` in [0, 1] (N x C x H x W), the same in
    model space (``inputs``) and their labels (class ids of the model's classes)."""

    pixels: torch.Tensor
    inputs: torch.Tensor
    labels: torch.Tensor
    source: str  # in words

    def split(self, held_out: int) -> tuple[PublicSet, PublicSet]:
        """(training part, the last ``held_out`` images)."""
        cut = len(self.labels) - held_out
        parts = [
            PublicSet(self.pixels[s], self.inputs[s], self.labels[s], self.source)
            for s in (slice(0, cut), slice(cut, None))
        ]
        return parts[0], parts[1]


def property_scores(pixels: torch.Tensor, prop: str) -> torch.Tensor:
    """SEER's property, higher first: the mean pixel (``brightest``) or its negative."""
    brightness = pixels.flatten(1).mean(dim=1)
    if prop == "brightest":
        return brightness
    if prop == "darkest":
        return -brightness
    raise ValueError(f"unknown property {prop!r}")


def target_of(pixels: torch.Tensor, prop: str) -> torch.Tensor:
    """The one image of a batch the decoder should give back: the property's top."""
    return pixels[int(property_scores(pixels, prop).argmax())]


@dataclass(frozen=True)
class TrainingOutcome:
    steps: int
    seconds: float
    # On held-out public batches of the update's size, through the client's own FedSGD
    # gradient: the mean PSNR (dB) of the decoded image against the property's top image,
    # and of the public mean of those images (what the decoder gives of an update carrying
    # nothing: the guess it must beat).
    held_out_psnr: float
    guess_psnr: float
    # Top-1 accuracy on the held-out public images before and after the training (SEER
    # trains no task loss).
    accuracy_before: float
    accuracy_after: float


def per_image_losses(model: nn.Module, weights: dict, inputs, labels) -> torch.Tensor:
    return F.cross_entropy(functional_call(model, weights, (inputs,)), labels, reduction="none")


def weighted_gradient(model, weights: dict, inputs, labels, combine, create_graph: bool):
    """The gradient of sum_i combine_i * loss_i, flat, in the order of ``weights``."""
    losses = per_image_losses(model, weights, inputs, labels)
    grads = torch.autograd.grad(
        (losses * combine).sum(), list(weights.values()), create_graph=create_graph
    )
    return torch.cat([g.flatten() for g in grads])


def client_gradient(model: nn.Module, inputs, labels) -> torch.Tensor:
    """The FedSGD update as the client sends it (mean cross-entropy), flat, named order."""
    weights = {n: p.detach().requires_grad_(True) for n, p in model.named_parameters()}
    losses = per_image_losses(model, weights, inputs, labels)
    grads = torch.autograd.grad(losses.mean(), list(weights.values()))
    return torch.cat([g.flatten() for g in grads])


def train_jointly(
    model: nn.Module,
    decoder,
    public: PublicSet,
    *,
    prop: str,
    images: int,
    steps: int,
    lr: float,
    model_lr: float,
    generator: torch.Generator,
    batches: str = "natural",
    layers: tuple[slice, ...] = (),
    dsnr_bound: float = 0.0,
    cancelled: Callable[[], bool] = lambda: False,
) -> int:
    """SEER's training (see the module's docstring) for ``steps`` steps on batches of
    ``images`` public images drawn with ``generator`` (``batch_drawer``); returns the steps
    taken. ``dsnr_bound`` > 0: also penalise, at each of ``layers`` (slices of the flat
    update), the top image's gradient norm over the others' summed gradient's norm above the
    bound (``dominance_penalty``)."""
    weights = dict(model.named_parameters())
    optimizer = torch.optim.Adam(
        [
            {"params": list(weights.values()), "lr": model_lr},
            {"params": list(decoder.parameters()), "lr": lr},
        ]
    )
    end_log2 = math.log2(max(images, 2))
    half = max(steps // 2, 1)
    draw = batch_drawer(public, prop, images, batches)
    taken = 0
    for step in range(steps):
        if cancelled():
            break
        pick = draw(generator)
        order = property_scores(public.pixels[pick], prop).argsort()
        pick = pick[order]  # the property's top image last
        inputs, labels, target = public.inputs[pick], public.labels[pick], public.pixels[pick[-1]]
        combos = _combinations(images, generator)
        grads = torch.stack(
            [weighted_gradient(model, weights, inputs, labels, c, True) for c in combos]
        )
        decoded = decoder.decode_flat(grads)
        with torch.no_grad():
            empty = decoder.decode_flat(torch.zeros_like(grads[:1]))[0]
        positive = (decoded[0] - target).pow(2).mean()
        negative = (decoded[1:] - empty).pow(2).mean()
        log2_alpha = ALPHA_START_LOG2 + (end_log2 - ALPHA_START_LOG2) * min(step / half, 1.0)
        alpha = 2.0**log2_alpha
        loss = positive / (alpha + 1) + negative * alpha / (alpha + 1)
        if dsnr_bound > 0:
            loss = loss + dominance_penalty(grads[0], grads[1], images, layers, dsnr_bound)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        taken += 1
    for p in model.parameters():
        p.grad = None
    return taken


def dominance_penalty(top, others, images: int, layers, bound: float) -> torch.Tensor:
    """A bound on SEER's D-SNR that costs no extra backward pass: at each layer the top
    image's gradient norm over the norm of the others' summed gradient (``others`` is that
    sum over sqrt(images - 1): SEER's column), squared above ``bound``. The others' summed
    norm is at most the sum of their norms, so this ratio is at least the layer's D-SNR for
    the top image: holding it under the bound holds the D-SNR under it."""
    scale = math.sqrt(max(images - 1, 1))
    terms = [
        F.relu(top[s].norm() / (others[s].norm() * scale + 1e-12) - bound).pow(2) for s in layers
    ]
    return torch.stack(terms).mean() if terms else top.new_zeros(())


def batch_drawer(public: PublicSet, prop: str, images: int, batches: str):
    """How each training step draws its public batch (indices into ``public``):

    - ``natural``: ``images`` at random (SEER's ``prop_mode max``): the top is the batch's;
    - ``one-above``: one image from above the public set's 1 - 1/images quantile of the
      property and the others from below it (SEER's ``prop_mode thresh`` draws its positive
      batches so, by shifting brightness instead of choosing images): a model without
      batch statistics (LeNet) sees one image at a time and can only learn an absolute
      threshold, which these batches teach without contradiction.
    """
    count = len(public.labels)
    if batches == "natural":
        return lambda generator: torch.randperm(count, generator=generator)[:images]
    if batches != "one-above":
        raise ValueError(f"unknown batches {batches!r}")
    scores = property_scores(public.pixels, prop)
    threshold = torch.quantile(scores, 1.0 - 1.0 / max(images, 2))
    above = (scores > threshold).nonzero().flatten()
    below = (scores <= threshold).nonzero().flatten()

    def draw(generator: torch.Generator) -> torch.Tensor:
        top = above[torch.randint(len(above), (1,), generator=generator)]
        rest = below[torch.randperm(len(below), generator=generator)[: images - 1]]
        return torch.cat([rest, top])

    return draw


def _combinations(images: int, generator: torch.Generator) -> list[torch.Tensor]:
    """SEER's three columns: the top image alone, the others' sum over sqrt(count), and a
    random unit combination of the others."""
    alone = torch.zeros(images)
    alone[-1] = 1.0
    others = torch.ones(images) / math.sqrt(max(images - 1, 1))
    others[-1] = 0.0
    mixed = torch.randn(images, generator=generator)
    mixed[-1] = 0.0
    mixed = mixed / mixed.norm().clamp_min(1e-12)
    return [alone, others, mixed]


def held_out_scores(
    model: nn.Module, decoder, held_out: PublicSet, *, prop: str, images: int, guess: torch.Tensor
) -> tuple[float, float]:
    """(mean PSNR of the decoded image, mean PSNR of ``guess``) over held-out batches of
    ``images``, each through the client's own gradient times the images (the decoder's
    scale: a sum of per-image gradients)."""
    decoded_psnr, guess_psnr = [], []
    batches = min(HELD_OUT_BATCHES, len(held_out.labels) // images)
    for k in range(batches):
        part = slice(k * images, (k + 1) * images)
        update = client_gradient(model, held_out.inputs[part], held_out.labels[part]) * images
        with torch.no_grad():
            decoded = decoder.decode_flat(update[None])[0].clamp(0, 1)
        target = target_of(held_out.pixels[part], prop)
        decoded_psnr.append(psnr(decoded, target))
        guess_psnr.append(psnr(guess, target))
    if not decoded_psnr:
        return math.nan, math.nan
    return sum(decoded_psnr) / len(decoded_psnr), sum(guess_psnr) / len(guess_psnr)


def psnr(image: torch.Tensor, target: torch.Tensor) -> float:
    """PSNR in dB of two images in [0, 1]."""
    mse = float((image - target).double().pow(2).mean())
    return 10 * math.log10(1.0 / max(mse, 1e-12))


def accuracy(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(inputs).argmax(dim=1) == labels).float().mean())


def mean_target(public: PublicSet, prop: str, images: int, generator: torch.Generator):
    """The public mean of the property's top image over batches of ``images``: where the
    decoder's output starts (its bias), so it starts at the guess and must beat it."""
    count = len(public.labels)
    tops = []
    for _ in range(min(256, max(count // images, 1))):
        pick = torch.randperm(count, generator=generator)[:images]
        tops.append(target_of(public.pixels[pick], prop))
    return torch.stack(tops).mean(dim=0)


def timed(function, *args, **kwargs):
    began = time.perf_counter()
    out = function(*args, **kwargs)
    return out, time.perf_counter() - began

"""The three models a malicious server builds here, each from the global model it would
have sent, with what it changed in words (``ServerModification``)."""

from __future__ import annotations

import copy
import math

import torch

from auditlib.server.bins import MeasurePrior, public_images
from auditlib.server.blocks import (
    ImprintBlock,
    LokiBlock,
    MaliciousModel,
    TrapBlock,
    calibrate_spread,
    device_of,
    scale_against_noise,
)
from auditlib.server.modification import (
    BuildContext,
    ServerModification,
    pixels,
    refuse_over_capacity,
    refuse_too_large,
    refuse_unwrappable,
)

# LOKI's lowest threshold: above 0 (another client's zero block never fires a row) and below
# any image but a black one.
LOKI_FLOOR = 1e-3
NOTICEABLE_IMPRINT = (
    "yes, if the client inspects it: a linear layer in front of the model whose rows share "
    "one direction (the mean pixel) with graded biases, and a layer after it with identical "
    "columns (the model's own input no longer reaches it); auditlib's model check flags it"
)


def build_rtf(
    context: BuildContext, bins: int, prior: MeasurePrior, prior_source: str
) -> ServerModification:
    """Robbing the Fed's imprint in front of the global model: ``bins`` brightness rows."""
    refuse_unwrappable(context.model, "rtf")
    size = pixels(context.input_shape)
    refuse_too_large("rtf", size, bins, size)
    refuse_over_capacity("rtf", context.batch_size * context.clients, bins, f"{bins} bins")
    thresholds = prior.thresholds(bins)
    block = ImprintBlock(context.input_shape, context.normalization, thresholds)
    model = copy.deepcopy(context.model)
    _calibrate(block, model, context, prior_source)
    against = _against_noise(block, model, context, prior_source)
    return ServerModification(
        attack="rtf",
        model=MaliciousModel(block, model),
        clients=context.clients,
        capacity=bins,
        rows=bins,
        thresholds=thresholds,
        prior=prior,
        what_changed=(
            f"an imprint block in front of the model: {bins} rows measuring brightness, "
            f"thresholds at quantiles of a Normal fitted on {prior.source}{against}"
        ),
        noticeable=NOTICEABLE_IMPRINT,
    )


def _against_noise(block, model, context: BuildContext, source: str) -> str:
    """Where the server knows the client's noise (the twin): under FedSGD, its block scaled
    against it (``scale_against_noise``); in words, what it did and expects ("" where it
    knows none)."""
    if context.noise_std is None or context.noise_std == 0:
        return ""
    if context.local_lr is not None:
        # Under FedAvg the scale is already the largest that keeps the thresholds in place
        # over the local steps (``calibrate_spread``): a larger one moves them.
        return (
            f"; it knows the client adds noise of standard deviation {context.noise_std:g}, "
            "but under FedAvg it keeps the scale that holds its thresholds in place over the "
            "local steps"
        )
    device = device_of(model)
    public = public_images(
        source, context.input_shape, context.audited_source, context.audited_pixels
    )
    public = context.normalization.normalize(public).to(device)
    generator = torch.Generator().manual_seed(context.seed)
    expected = context.batch_size * context.clients
    scaled = scale_against_noise(
        block.to(device),
        model,
        public,
        expected,
        context.noise_std,
        context.clip_norm,
        generator,
        context.training,
    )
    clip = (
        f" after the client clips its update to L2 norm {context.clip_norm:g}"
        if context.clip_norm is not None
        else ""
    )
    expects = (
        "no public image had a gradient at its rows, so it expects nothing"
        if math.isinf(scaled.pixel_error)
        else f"it expects a per-pixel error of about {scaled.pixel_error:.2g} "
        f"({-20 * math.log10(scaled.pixel_error):.0f} dB) on the weaker images{clip}"
    )
    return (
        f"; knowing the client adds noise of standard deviation {context.noise_std:g}"
        f"{' and clips' if context.clip_norm is not None else ''}, it scaled the block's "
        f"rows down and its spread up by {scaled.factor:.3g} (the model after it sees the "
        f"same input; each image's update at the rows grows by that factor): {expects}"
    )


def build_cah(
    context: BuildContext,
    rows: int,
    sigma: float,
    scale: float,
    calibrate_on: str | None = None,
) -> ServerModification:
    """Curious Abandon Honesty's trap weights in a layer in front of the global model.

    ``calibrate_on`` (a public set): each row's bias set so that it fires for one in B of
    that set's images (B: the images the server expects), instead of the paper's bias 0,
    whose firing rate falls with the image size (the rows' mean grows with the pixels, their
    spread with its square root)."""
    refuse_unwrappable(context.model, "cah")
    size = pixels(context.input_shape)
    refuse_too_large("cah", size, rows, size)
    expected = context.batch_size * context.clients
    refuse_over_capacity("cah", expected, rows, f"{rows} trap rows")
    generator = torch.Generator().manual_seed(context.seed)
    block = TrapBlock(context.input_shape, context.normalization, rows, sigma, scale, generator)
    if calibrate_on is not None:
        public = public_images(
            calibrate_on, context.input_shape, context.audited_source, context.audited_pixels
        )
        with torch.no_grad():
            fired = public.flatten(1) @ block.bins.weight.T  # images x rows
            share = max(1.0 - 1.0 / max(expected, 2), 0.5)
            block.bins.bias.copy_(-torch.quantile(fired, share, dim=0))
    return ServerModification(
        attack="cah",
        model=MaliciousModel(block, copy.deepcopy(context.model)),
        clients=context.clients,
        capacity=rows,
        rows=rows,
        thresholds=None,
        prior=None,
        what_changed=(
            f"a fully connected layer of {rows} trap rows in front of the model (half of each "
            f"row's weights negative, the other half the same magnitudes times {scale}"
            + (
                f"; each row's bias set to fire for one in {expected} images of {calibrate_on})"
                if calibrate_on
                else ", biases 0)"
            )
        ),
        noticeable=(
            "yes, if the client inspects it: each trap row's weights sum far below zero and "
            "its units fire for very few images; auditlib's model check flags it"
        ),
    )


def build_loki(
    context: BuildContext, per_client: int, prior: MeasurePrior, prior_source: str
) -> ServerModification:
    """LOKI: each client's own kernels, then ``per_client`` brightness rows per client."""
    refuse_unwrappable(context.model, "loki")
    size = pixels(context.input_shape)
    rows = per_client * context.clients
    refuse_too_large("loki", size * context.clients, rows, size)
    refuse_over_capacity("loki", context.batch_size, per_client, f"{per_client} bins per client")
    thresholds = prior.thresholds(per_client, lowest=LOKI_FLOOR)
    thresholds = tuple(max(t, LOKI_FLOOR * (1 + k)) for k, t in enumerate(thresholds))
    block = LokiBlock(context.input_shape, context.normalization, context.clients, thresholds)
    model = copy.deepcopy(context.model)
    _calibrate(block, model, context, prior_source)
    return ServerModification(
        attack="loki",
        model=MaliciousModel(block, model),
        clients=context.clients,
        capacity=per_client,
        rows=per_client,
        thresholds=thresholds,
        prior=prior,
        what_changed=(
            f"per-client convolution kernels routing each of {context.clients} clients' "
            f"pixels into a channel block of its own, then {per_client} brightness rows per "
            f"client (thresholds from a Normal fitted on {prior.source})"
        ),
        noticeable=(
            "yes, if the client inspects it, and more easily than the others: its first "
            "convolution's kernels are zero but for one centre tap per channel of one block, "
            "and clients comparing models would find them differ; auditlib's model check "
            "flags it"
        ),
    )


# Public images the server runs through its model to set the block's scale under FedAvg.
CALIBRATION_IMAGES = 16


def _calibrate(block, model, context: BuildContext, source: str) -> None:
    """Under FedAvg, scale the block's ``spread`` on public images (``calibrate_spread``)."""
    if context.local_lr is None:
        return
    device = device_of(model)
    public = public_images(
        source, context.input_shape, context.audited_source, context.audited_pixels
    )
    public = context.normalization.normalize(public[:CALIBRATION_IMAGES]).to(device)
    calibrate_spread(block.to(device), model, public, context.local_lr)

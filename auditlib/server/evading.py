"""Malicious servers that know the client's model check and build blocks that pass it.

Each computes what its built server computes (``server.build``) in a form the check's
weight signatures and its batch check (``defenses.model_signatures``) do not read, at the
least cost to the read-back (``server.evading_blocks``). ``ServerModification.evasion``
says, in words, what each does to pass and what that costs the attack.
"""

from __future__ import annotations

import copy
import math
import statistics

import torch
from torch import nn

from auditlib.errors import AuditInputError
from auditlib.server.bins import public_images, public_prior
from auditlib.server.blocks import STEP_PER_PIXEL, MaliciousModel, ToPixels, device_of, trap_weights
from auditlib.server.build import LOKI_FLOOR
from auditlib.server.evading_blocks import (
    DECOY_MARGIN,
    ConvThenBlock,
    DisguisedClientKernels,
    EvadingBlock,
    EvadingLokiBlock,
    first_convolution,
    jittered,
    rows_layer,
    with_decoys,
)
from auditlib.server.modification import (
    BuildContext,
    ServerModification,
    pixels,
    refuse_over_capacity,
    refuse_too_large,
    refuse_unwrappable,
)

# The lowest row fires for every image: its threshold sits this many standard deviations of
# the public measure below its mean.
BELOW_ALL = 20.0
NOTICEABLE = (
    "not by auditlib's model check as it stood when this server was built (its weight "
    "signatures and its batch check pass); a client comparing the model's behaviour with an "
    "honest one's (the model after the block sees one number per image, not the image) could"
)
DOMINANCE = {
    "clamp": "its activation is clamp_min(0), not the ReLU module or function the batch "
    "check watches (the same function and gradient)",
    "threshold": "its activation is F.threshold(x, 0, 0), not the ReLU module or function "
    "the batch check watches (the same function and gradient)",
    "relu": "its activation is a ReLU (the batch check sees it where the rows are an "
    "nn.Linear, and flags it where most firing rows hold one image and most stay silent)",
}
DECOY_WORDS = (
    "{0} decoy rows after its {1} own (random directions at their scale, each with a bias "
    "{2:g} times what its weights can reach on any input, so each fires for every image): "
    "they split no batch and no image owns them, so the share of the layer's units the "
    "behaviour check finds nested or owned falls by {3:.2g}; the read-back skips them, at "
    "the cost of {0} more rows' parameters (a client could notice biases no input can "
    "reach)"
)


def decoy_words(count: int, own: int) -> str:
    if count == 0:
        return "no decoy rows (the behaviour check reads the rows as they are)"
    return DECOY_WORDS.format(count, own, DECOY_MARGIN, own / (own + count))


SPREAD_WORDS = (
    "spread's columns jittered by {0:g} (relative; identical to 1e-6 is flagged): each "
    "image's gradient at the rows differs across rows by about {0:g}, which leaves each "
    "read-back an error near {0:g} of its bin's neighbours (about 100 dB)"
)


def thresholds_along_rows(
    rows: torch.Tensor, measures: torch.Tensor, floor: float | None = None
) -> tuple[float, ...]:
    """Row k's threshold: quantile k / N of a Normal fitted on the public images' measure
    along row k's own direction (``measures``: images x rows); row 0 below every image
    (``BELOW_ALL``), or at ``floor`` and above (LOKI: above 0)."""
    count = rows.shape[0]
    out = []
    for k in range(count):
        values = measures[:, k].double()
        mean, std = float(values.mean()), max(float(values.std()), 1e-6)
        if k == 0:
            out.append(mean - BELOW_ALL * std if floor is None else floor)
            continue
        value = statistics.NormalDist(mean, std).inv_cdf(k / count)
        out.append(value if floor is None else max(value, floor * (1 + k)))
    return tuple(out)


def _public(source: str, shape, context: BuildContext) -> torch.Tensor:
    """The public set's images in model space at ``shape``."""
    images = public_images(source, shape, context.audited_source, context.audited_pixels)
    return context.normalization.normalize(images)


@torch.no_grad()
def _calibrate(
    block: nn.Module, model: nn.Module, public: torch.Tensor, lr: float, features: int
) -> None:
    """Under FedAvg, scale ``spread`` so that lr x delta on public images is
    ``STEP_PER_PIXEL`` over ``features`` (as ``blocks.calibrate_spread``: the pixels), delta
    read at the rows' pre-activation wherever the block sits in ``model``."""
    kept: list[torch.Tensor] = []

    def keep(module, inputs, output):
        output.retain_grad()
        kept.append(output)

    hook = block.bins.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            logits = model(public)
            labels = torch.zeros(public.shape[0], dtype=torch.long, device=logits.device)
            torch.nn.functional.cross_entropy(logits, labels, reduction="sum").backward()
    finally:
        hook.remove()
    model.zero_grad(set_to_none=True)
    delta = kept[0].grad.flatten(1).abs().amax(dim=1)
    typical = float(delta.median())
    if typical == 0.0 or not math.isfinite(typical):
        return
    block.spread.weight.mul_(STEP_PER_PIXEL / (features * lr * typical))


CALIBRATION_IMAGES = 16


def build_rtf_evading(
    context: BuildContext,
    bins: int,
    prior_source: str,
    disguise: str,
    activation: str,
    jitter: float,
    spread_jitter: float,
    decoys: int = 0,
) -> ServerModification:
    """Robbing the Fed's imprint, disguised: ``conv`` (the rows a whole-input Conv2d),
    ``jitter`` (a Linear, each row jittered by ``jitter``), ``after-conv`` (a whole-map
    Conv2d behind the model's first convolution)."""
    refuse_unwrappable(context.model, "rtf-evading")
    refuse_over_capacity("rtf-evading", context.batch_size * context.clients, bins, f"{bins} bins")
    generator = torch.Generator().manual_seed(context.seed)
    model = copy.deepcopy(context.model)
    public = _public(prior_source, context.input_shape, context)
    after = disguise == "after-conv"
    front: nn.Module = ToPixels(context.normalization)
    path = ""
    if after:
        found = first_convolution(model)
        if found is None:
            raise AuditInputError(
                "rtf-evading's after-conv disguise puts its block behind the model's first "
                "convolution; this model has none: choose disguise conv or jitter"
            )
        path, conv = found
        with torch.no_grad():
            features = conv(public.to(device_of(model))).cpu()
        front = nn.Identity()
        shape = tuple(features.shape[1:])
    else:
        with torch.no_grad():
            features = front(public)
        shape = context.input_shape
    size = math.prod(shape)
    refuse_too_large("rtf-evading", size, bins + decoys, size)
    rows = torch.full((bins, size), 1.0 / size)
    if disguise == "jitter":
        rows = jittered(rows, jitter, generator)
    thresholds = thresholds_along_rows(rows, features.flatten(1) @ rows.T)
    bound = 1.0 if not after else 2 * float(features.abs().max())  # pixels lie in [0, 1]
    rows, biases = with_decoys(rows, -torch.tensor(thresholds), decoys, bound, generator)
    layer = rows_layer(rows, biases, shape, conv=disguise != "jitter")
    block = EvadingBlock(front, layer, shape, activation, spread_jitter, generator)
    if after:
        model.set_submodule(path, ConvThenBlock(conv, block.to(device_of(model))))
        sent, bins_name = model, f"{path}.block.bins"
    else:
        sent, bins_name = MaliciousModel(block, model), "server_block.bins"
    if context.local_lr is not None:
        calibration = public[:CALIBRATION_IMAGES].to(device_of(model))
        _calibrate(block, sent, calibration, context.local_lr, size)
    where = {
        "conv": "its rows are a Conv2d whose kernel covers the whole image (4-D weights, "
        "which the check's linear tests skip; the same function as the linear rows, nothing "
        "lost)",
        "jitter": f"each row is the mean pixel times (1 + {jitter:g} N(0, 1)) entry by entry, "
        "so no two rows are parallel to 0.99, its threshold taken along its own direction: "
        "the rows no longer sort images in one order, so an image near a threshold can "
        "share a bin's difference with a neighbour (some read-backs drop from exact to "
        "80 to 100 dB)",
        "after-conv": f"its block sits behind the model's first convolution ({path}), its "
        "rows a Conv2d over that layer's whole output: the first layer and the input look "
        "honest; a read-back is that layer's output, which the server inverts to pixels by "
        "conjugate gradients on the convolution's normal equations (exact where the "
        "convolution has full column rank, as LeNet's 12 channels at stride 2 and "
        "ResNet-18's 64 at stride 2 do; a convolution with fewer outputs than pixels loses "
        "what it does not see), at some seconds per image at 224 px",
    }[disguise]
    prior = public_prior(prior_source, context.audited_source, context.audited_pixels)
    return ServerModification(
        attack="rtf-evading",
        model=sent,
        clients=context.clients,
        capacity=bins,
        rows=bins,
        thresholds=thresholds,
        prior=prior,
        what_changed=(
            f"an imprint block disguised to pass the model check ({disguise}): {bins} rows "
            f"measuring brightness, thresholds at quantiles of Normals fitted on "
            f"{prior.source} along each row"
        ),
        noticeable=NOTICEABLE,
        bins_name=bins_name,
        evasion=f"{where}; {SPREAD_WORDS.format(spread_jitter)}; {DOMINANCE[activation]}; "
        f"{decoy_words(decoys, bins)}",
        decoys=decoys,
    )


def build_cah_evading(
    context: BuildContext,
    rows: int,
    sigma: float,
    disguise: str,
    activation: str,
    mirror_noise: float,
    spread_jitter: float,
    calibrate_on: str,
    decoys: int = 0,
) -> ServerModification:
    """Curious Abandon Honesty's trap rows, disguised: ``noisy`` (the paper's rows, scale
    0.95, their positive magnitudes times 1 + ``mirror_noise`` N(0, 1)), ``balanced`` (the
    same with the mirror factor 1, so rows sum near zero and the row-sum test passes at any
    size). Each row's bias is set on public data to fire for one image in B."""
    refuse_unwrappable(context.model, "cah-evading")
    size = pixels(context.input_shape)
    refuse_too_large("cah-evading", size, rows + decoys, size)
    expected = context.batch_size * context.clients
    refuse_over_capacity("cah-evading", expected, rows, f"{rows} trap rows")
    generator = torch.Generator().manual_seed(context.seed)
    scale = 1.0 if disguise == "balanced" else 0.95
    weights = trap_weights(rows, size, sigma, scale, generator)
    positive = weights > 0
    weights[positive] = jittered(weights[positive], mirror_noise, generator)
    public = public_images(
        calibrate_on, context.input_shape, context.audited_source, context.audited_pixels
    )
    fired = public.flatten(1) @ weights.T  # images x rows, on [0, 1] pixels
    share = max(1.0 - 1.0 / max(expected, 2), 0.5)
    biases = -torch.quantile(fired, share, dim=0)
    weights, biases = with_decoys(weights, biases, decoys, 1.0, generator)  # pixels in [0, 1]
    layer = rows_layer(weights, biases, context.input_shape, conv=False)
    block = EvadingBlock(
        ToPixels(context.normalization),
        layer,
        context.input_shape,
        activation,
        spread_jitter,
        generator,
    )
    what = {
        "noisy": "trap rows (scale 0.95) whose positive magnitudes are multiplied by "
        f"1 + {mirror_noise:g} N(0, 1), so they no longer mirror the negative ones to 1e-4 "
        "(the read-back, a row's update over its bias's, does not depend on the row's "
        "weights: nothing lost); their sums stay far below zero, which the row-sum test "
        "catches at 224 px (median z about -8) but not at 32 px (about -1)",
        "balanced": "trap rows with mirror factor 1 (their sums near zero, so the row-sum "
        f"test passes at any size) and positive magnitudes times 1 + {mirror_noise:g} "
        "N(0, 1) (no mirror to 1e-4); they fire rarely through their negative biases, set on "
        "public data: the read-back does not depend on the rows' weights, nothing lost",
    }[disguise]
    return ServerModification(
        attack="cah-evading",
        model=MaliciousModel(block, copy.deepcopy(context.model)),
        clients=context.clients,
        capacity=rows,
        rows=rows,
        thresholds=None,
        prior=None,
        what_changed=(
            f"a layer of {rows} trap rows in front of the model, disguised to pass the model "
            f"check ({disguise}); each row's bias set to fire for one in {expected} images of "
            f"{calibrate_on}"
        ),
        noticeable=NOTICEABLE,
        evasion=f"{what}; {SPREAD_WORDS.format(spread_jitter)}; {DOMINANCE[activation]}; "
        f"{decoy_words(decoys, rows)}",
        decoys=decoys,
    )


def build_loki_evading(
    context: BuildContext,
    per_client: int,
    prior_source: str,
    disguise: str,
    activation: str,
    jitter: float,
    spread_jitter: float,
    tap_share: float,
    decoys: int = 0,
) -> ServerModification:
    """LOKI, disguised: client kernels with weight on every tap (``taps``: ``tap_share`` / 8
    of the centre on each; ``random``: a random kernel of that total), rows jittered by
    ``jitter`` within each client's block, ``spread``'s columns jittered."""
    refuse_unwrappable(context.model, "loki-evading")
    size = pixels(context.input_shape)
    clients = context.clients
    refuse_too_large("loki-evading", size * clients, per_client * clients + decoys, size)
    refuse_over_capacity(
        "loki-evading", context.batch_size, per_client, f"{per_client} bins per client"
    )
    generator = torch.Generator().manual_seed(context.seed)
    kernels = DisguisedClientKernels(
        context.normalization, clients, disguise, tap_share, context.seed
    )
    public = _public(prior_source, context.input_shape, context)
    own = jittered(torch.full((per_client, size), 1.0 / size), jitter, generator)
    rows = torch.zeros(per_client * clients, size * clients)
    biases = torch.zeros(per_client * clients)
    channels = context.input_shape[0]
    bound = 0.0  # the largest feature any client's kernels give a public image, doubled
    for k in reversed(range(clients)):  # the same rows in every block, reading it alone
        with torch.no_grad():  # client k's features: its own kernels set its thresholds
            kernels.select(k)
            features = kernels(public)[:, k * channels : (k + 1) * channels].flatten(1)
        thresholds = thresholds_along_rows(own, features @ own.T, floor=LOKI_FLOOR)
        rows[k * per_client : (k + 1) * per_client, k * size : (k + 1) * size] = own
        biases[k * per_client : (k + 1) * per_client] = -torch.tensor(thresholds)
        bound = max(bound, 2 * float(features.abs().max()))
    rows, biases = with_decoys(rows, biases, decoys, bound, generator)
    block = EvadingLokiBlock(
        kernels,
        rows,
        biases,
        context.input_shape,
        activation,
        spread_jitter,
        generator,
        thresholds,
    )
    model = copy.deepcopy(context.model)
    sent = MaliciousModel(block, model)
    if context.local_lr is not None:
        calibration = public[:CALIBRATION_IMAGES].to(device_of(model))
        _calibrate(block, sent, calibration, context.local_lr, size)
    ratio = 1 / tap_share  # the centre over the other taps' sum (``random``: near it)
    kernel_words = {
        "taps": f"each client's kernel has {tap_share / 8:.3g} of its centre on each other "
        f"tap (transmit ratio {ratio:g}, the check flags above 10)",
        "random": f"each client's kernel has random taps around its centre, |N(0, 1)| "
        f"times {tap_share / 8:.3g} of it (transmit ratio near {ratio:g}, the check flags "
        "above 10)",
    }[disguise]
    return ServerModification(
        attack="loki-evading",
        model=sent,
        clients=clients,
        capacity=per_client,
        rows=per_client,
        thresholds=thresholds,  # client 0's (the loop ends on it); each block has its own
        prior=public_prior(prior_source, context.audited_source, context.audited_pixels),
        what_changed=(
            f"per-client convolution kernels routing each of {clients} clients' images into "
            f"a channel block of its own, then {per_client} brightness rows per client, "
            f"disguised to pass the model check ({disguise})"
        ),
        noticeable=NOTICEABLE
        + "; clients comparing the models they received would find the kernels differ",
        evasion=(
            f"{kernel_words}: a read-back is the client's pixels through its kernel, which "
            "the server, knowing it, inverts by conjugate gradients (well conditioned: the "
            "centre outweighs the rest; exact to float precision); each client's rows are "
            f"the mean pixel times (1 + {jitter:g} N(0, 1)) within its block, so no two are "
            "parallel to 0.99, their thresholds along each row (an image near a threshold "
            f"can lose its exactness, as rtf's jittered rows); "
            f"{SPREAD_WORDS.format(spread_jitter)}; {DOMINANCE[activation]}; "
            f"{decoy_words(decoys, per_client * clients)}"
        ),
        decoys=decoys,
    )

"""A learned disguise in the spirit of SEER: the shared model trained jointly with a secret
decoder on public data, so that the client's FedSGD update carries one image of its batch,
chosen by a secret property (the brightest by default), which only the decoder reads back.

Garov, Dimitrov, Jovanović, Vechev, "Hiding in Plain Sight: Disguising Data Stealing Attacks
in Federated Learning" (ICLR 2024). The server sends the global model's own architecture
with its own layers (no block is inserted), its weights changed by the training
(``disguise_training``); the decoder never leaves the server. A client's weight check sees an
ordinary model of its architecture; what the server gives up is said in
``DisguisedModification.evasion``.

The training is the expensive part (minutes on a CPU for LeNet at 32 px), so a trained
server is kept per (architecture and weights, input shape, images per update, property,
seed, public set, training settings): in this process, and on disk under the data folder
(``paths.data_dir() / "cache" / "disguise"``, safetensors and a JSON of the scores).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from auditlib.data.model_input import content_hashes
from auditlib.data.samples import SAMPLE_SETS, load_sample_set, load_training_pool
from auditlib.errors import AuditInputError
from auditlib.paths import data_dir, private
from auditlib.server.bins import PUBLIC_PRIORS, MeasurePrior, public_images
from auditlib.server.disguise_training import (
    PublicSet,
    TrainingOutcome,
    accuracy,
    held_out_scores,
    mean_target,
    timed,
    train_jointly,
)
from auditlib.server.modification import BuildContext, ServerModification

# What trains here on a CPU in minutes: the double backward through the model costs about
# three of its backward passes per step and the decoder reads a share of every layer.
MAX_MODEL_PARAMETERS = 2_000_000
MAX_SIDE = 32
MAX_IMAGES = 64  # images per update (batch times clients) the decoder disaggregates
MAX_DECODER_PARAMETERS = 64_000_000  # 256 MB of float32, and Adam's two moments as much again
# Public images: Fashion-MNIST's train split (disjoint from the test split the sample set
# audits), or the bundled sets the brightness prior uses.
PUBLIC_SETS = ("fashion-mnist-train", "faces", "digits")
FASHION_TRAIN_IMAGES = 4096
HELD_OUT = 256  # public images kept out of the training to score the decoder on
# The whole update (``ServerModification.bins_name``): the decoder reads entries of every
# layer, not one inserted layer's.
WHOLE_UPDATE = ""


@dataclass(frozen=True)
class DisguiseSettings:
    """How the server trains its disguise (``attacks.seer``'s config, as the server takes it)."""

    property: str  # "brightest" or "darkest"
    public: str  # one of PUBLIC_SETS
    steps: int
    lr: float  # the decoder's Adam learning rate
    model_lr: float  # the shared model's
    hidden: int  # the disaggregator's width; 0: none (SEER's default decoder, "nomid")
    per_layer: int  # entries read of each parameter at least (SEER's par_sel_size)
    fraction: float  # and this share of each (SEER's par_sel_frac)
    batches: str = "natural"  # how training batches are drawn (``batch_drawer``)
    dsnr_bound: float = 0.0  # 0: SEER's loss alone; else ``dominance_penalty``'s bound


class SecretDecoder(nn.Module):
    """SEER's decoder: fixed random entries of the update (``index`` into the update's
    parameters flattened in the model's named order), a linear disaggregator without bias
    (additive: the decoding of a sum is the sum of decodings, up to the output's bias) and an
    affine reconstructor to pixels in [0, 1]."""

    def __init__(
        self,
        names: tuple[str, ...],
        sizes: tuple[int, ...],
        index: torch.Tensor,
        hidden: int,
        shape: tuple[int, int, int],
    ) -> None:
        super().__init__()
        self.names, self.sizes, self.shape = names, sizes, shape
        self.register_buffer("index", index)
        pixels = math.prod(shape)
        width = hidden or len(index)
        self.disaggregator = nn.Linear(len(index), hidden, bias=False) if hidden else nn.Identity()
        self.reconstructor = nn.Linear(width, pixels)
        with torch.no_grad():  # start near the guess (the bias is set by the build)
            self.reconstructor.weight.mul_(0.01)

    def decode_flat(self, flat: torch.Tensor) -> torch.Tensor:
        """Updates flattened in named order (N x total) to pixels (N x C x H x W), unclamped."""
        chosen = flat.index_select(1, self.index)
        return self.reconstructor(self.disaggregator(chosen)).view(-1, *self.shape)

    def read(self, update: dict[str, torch.Tensor], images: int) -> torch.Tensor:
        """The one image (C x H x W, pixels in [0, 1]) of a FedSGD update by name: the mean
        gradient over ``images`` images, times them (the decoder's scale)."""
        missing = [n for n in self.names if n not in update]
        if missing:
            raise KeyError(missing[0])
        flat = torch.cat([update[n].detach().float().cpu().flatten() for n in self.names])
        with torch.no_grad():
            return self.decode_flat(flat[None] * images)[0].clamp(0, 1)


@dataclass(frozen=True, eq=False)
class DisguisedModification(ServerModification):
    """A disguised server's model and what it keeps to itself: the decoder, the images per
    update it was trained for, the property it reads, and its training's scores."""

    decoder: SecretDecoder | None = None
    images: int = 0
    property: str = "brightest"
    outcome: TrainingOutcome | None = None

    def __post_init__(self) -> None:
        if self.decoder is None or self.images < 1 or self.outcome is None:
            raise ValueError("a disguised server needs its decoder, images and outcome")


def refuse_untrainable(context: BuildContext, name: str) -> int:
    """Refuse what does not train here (or under a protocol it is not built for); returns
    the images per update."""
    if context.local_lr is not None:
        raise AuditInputError(
            f"{name} is built for FedSGD, as SEER is: its decoder is trained on the gradient "
            "of one batch, and under FedAvg the update is several steps' gradients at moving "
            "weights that it was not trained on (training through the client's local steps "
            "costs their count again per step); audit it with protocol fedsgd"
        )
    _, height, width = context.input_shape
    if max(height, width) > MAX_SIDE:
        raise AuditInputError(
            f"{name} trains the model and its decoder here, on the CPU, in minutes: inputs of "
            f"at most {MAX_SIDE} x {MAX_SIDE} px (SEER's CIFAR size); these are {height} x "
            f"{width}: resize the images or audit a smaller input"
        )
    count = sum(p.numel() for p in context.model.parameters() if p.requires_grad)
    if count > MAX_MODEL_PARAMETERS:
        raise AuditInputError(
            f"{name} trains the model jointly with its decoder here, on the CPU, in minutes "
            f"(a double backward per step): models of at most {MAX_MODEL_PARAMETERS / 1e6:.0f} "
            f"M parameters; this one has {count / 1e6:.1f} M"
        )
    images = context.batch_size * context.clients
    if images > MAX_IMAGES:
        raise AuditInputError(
            f"{name} disaggregates at most {MAX_IMAGES} images per update (its training step "
            f"takes that many public images); this update sums {images}"
        )
    return images


def read_index(model: nn.Module, per_layer: int, fraction: float, seed: int) -> torch.Tensor:
    """SEER's ``ParamSelector``: of each parameter, max(per_layer, fraction of it) random
    entries (all where it has fewer), as indices into the flat named update, ascending."""
    generator = torch.Generator().manual_seed(seed)
    chosen, offset = [], 0
    for _, p in named_trainable(model):
        take = min(p.numel(), max(per_layer, round(p.numel() * fraction)))
        chosen.append(torch.randperm(p.numel(), generator=generator)[:take].sort().values + offset)
        offset += p.numel()
    return torch.cat(chosen)


def weight_slices(model: nn.Module) -> tuple[slice, ...]:
    """Where each ``nn.Linear`` and ``nn.Conv2d`` weight (the layers D-SNR looks at) lies in
    the flat update in named order."""
    watched = {
        f"{name}.weight"
        for name, m in model.named_modules()
        if isinstance(m, (nn.Linear, nn.Conv2d))
    }
    slices, offset = [], 0
    for name, p in named_trainable(model):
        if name in watched:
            slices.append(slice(offset, offset + p.numel()))
        offset += p.numel()
    return tuple(slices)


def named_trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def build_disguise(
    context: BuildContext, settings: DisguiseSettings, name: str, cancelled=None
) -> DisguisedModification:
    """The disguised server for ``context``: trained, or from the cache."""
    images = refuse_untrainable(context, name)
    public = public_set(settings.public, context)
    key = cache_key(context, settings, images)
    cached = _CACHE.get(key) or _from_disk(key, context, settings)
    if cached is None:
        cached = _train(context, settings, images, public, cancelled)
        if cached[2].steps < settings.steps:  # cancelled part way: not the server asked for
            raise AuditInputError(f"{name}'s training was cancelled")
        _to_disk(key, *cached)
    _CACHE[key] = cached
    state, decoder_state, outcome = cached
    model = copy.deepcopy(context.model)
    model.load_state_dict(state)
    decoder = _decoder(model, settings, context)
    decoder.load_state_dict(decoder_state)
    return _modification(name, context, settings, images, model, decoder, outcome, public)


def _decoder(model: nn.Module, settings: DisguiseSettings, context: BuildContext):
    named = named_trainable(model)
    index = read_index(model, settings.per_layer, settings.fraction, context.seed)
    pixels = math.prod(context.input_shape)
    width = settings.hidden or len(index)
    size = len(index) * settings.hidden + (width + 1) * pixels  # counted before it is built
    if size > MAX_DECODER_PARAMETERS:
        raise AuditInputError(
            f"the secret decoder would hold {size / 1e6:.0f} M parameters ({len(index)} "
            f"entries read), more than the {MAX_DECODER_PARAMETERS / 1e6:.0f} M trained here: "
            "set hidden to a width (e.g. 256), or read fewer entries (per_layer, fraction)"
        )
    with torch.random.fork_rng(devices=[]):  # its init from the seed, the global RNG kept
        torch.manual_seed(context.seed)
        decoder = SecretDecoder(
            tuple(n for n, _ in named),
            tuple(p.numel() for _, p in named),
            index,
            settings.hidden,
            context.input_shape,
        )
    return decoder


def _train(context, settings: DisguiseSettings, images: int, public: PublicSet, cancelled):
    model = copy.deepcopy(context.model).float().cpu()
    model.train(context.training)
    generator = torch.Generator().manual_seed(context.seed)
    decoder = _decoder(model, settings, context)
    train, held_out = public.split(HELD_OUT)
    guess = mean_target(train, settings.property, images, generator)
    with torch.no_grad():
        decoder.reconstructor.bias.copy_(guess.flatten())
    before = accuracy(model, held_out.inputs, held_out.labels)
    steps, seconds = timed(
        train_jointly,
        model,
        decoder,
        train,
        prop=settings.property,
        images=images,
        steps=settings.steps,
        lr=settings.lr,
        model_lr=settings.model_lr,
        generator=generator,
        batches=settings.batches,
        layers=weight_slices(model),
        dsnr_bound=settings.dsnr_bound,
        cancelled=cancelled or (lambda: False),
    )
    decoded, guessed = held_out_scores(
        model, decoder, held_out, prop=settings.property, images=images, guess=guess
    )
    outcome = TrainingOutcome(
        steps, seconds, decoded, guessed, before, accuracy(model, held_out.inputs, held_out.labels)
    )
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state, {k: v.detach().clone() for k, v in decoder.state_dict().items()}, outcome


def _modification(name, context, settings, images, model, decoder, outcome, public):
    prop = settings.property
    mean = float(public.pixels.flatten(1).mean(dim=1).mean())
    std = float(max(public.pixels.flatten(1).mean(dim=1).std(), 1e-3))
    accuracy_words = (
        f"top-1 accuracy on held-out public images {outcome.accuracy_before:.0%} before, "
        f"{outcome.accuracy_after:.0%} after (SEER trains no task loss)"
    )
    return DisguisedModification(
        attack=name,
        model=model,
        clients=context.clients,
        capacity=1,
        rows=0,
        thresholds=None,
        prior=MeasurePrior(min(max(mean, 0.0), 1.0), std, public.source),
        what_changed=(
            f"the model's own weights, trained {outcome.steps} steps jointly with a secret "
            f"decoder on {public.source} so that the update of {images} images carries the "
            f"{prop} one (held-out public batches: {outcome.held_out_psnr:.1f} dB decoded, "
            f"{outcome.guess_psnr:.1f} dB for the mean guess); no layer added"
        ),
        noticeable=(
            "not by its weights' structure: the same layers and shapes as the global model, "
            "trained weights with no inserted block; but a client comparing the weights with "
            "the global model's would see them changed, one measuring how far one image's "
            "gradient dominates a layer on its batch (SEER's D-SNR) can find the brightest "
            "image's standing out (the short training here concentrates it: "
            f"benchmarks/disguise.py), and its {accuracy_words}"
        ),
        bins_name=WHOLE_UPDATE,
        evasion=(
            f"it trains the shared model's own weights ({outcome.seconds:.0f} s here) instead "
            "of inserting a block, so no imprint rows, trap rows or one-tap kernels are left "
            "to flag; it gives up exactness and all but one image: one image per update (the "
            f"{prop}), decoded approximately by a learned linear decoder, blurred toward the "
            f"public mean where the batch's {prop} does not stand out from the others; "
            f"{accuracy_words}"
        ),
        decoder=decoder,
        images=images,
        property=prop,
        outcome=outcome,
    )


# ---- public data ------------------------------------------------------------------------


def public_set(source: str, context: BuildContext) -> PublicSet:
    """The server's public images and labels at the model's input shape, refused where they
    hold any audited image (``bins.public_prior``'s refusals, or the content hashes)."""
    if source not in PUBLIC_SETS:
        raise AuditInputError(
            f"unknown public data {source!r} for the disguise; expected one of "
            f"{', '.join(PUBLIC_SETS)}"
        )
    classes = _classes(context)
    if source == "fashion-mnist-train":
        arrays, labels = _fashion_train()
        pixels = _resized(torch.from_numpy(arrays).float().div(255).permute(0, 3, 1, 2), context)
        _refuse_audited(source, arrays, context)
        words = f"{len(labels)} Fashion-MNIST training images"
    else:
        pixels = public_images(
            source, context.input_shape, context.audited_source, context.audited_pixels
        )
        labels = np.array(_set_labels(source))
        words = f"{len(labels)} images of {SAMPLE_SETS[source].name}"
    labels = torch.from_numpy(np.asarray(labels, dtype=np.int64)) % classes
    inputs = context.normalization.normalize(pixels)
    return PublicSet(pixels, inputs.float(), labels, words)


def _classes(context: BuildContext) -> int:
    with torch.no_grad():
        probe = copy.deepcopy(context.model).cpu().eval()
        return int(probe(torch.zeros(1, *context.input_shape)).shape[1])


def _resized(pixels: torch.Tensor, context: BuildContext) -> torch.Tensor:
    channels, height, width = context.input_shape
    pixels = F.interpolate(pixels, size=(height, width), mode="bilinear", align_corners=False)
    if pixels.shape[1] != channels:
        pixels = pixels.mean(dim=1, keepdim=True).expand(-1, channels, -1, -1)
    return pixels.clamp(0, 1).contiguous()


@functools.cache
def _fashion_train() -> tuple[np.ndarray, np.ndarray]:
    images, labels = load_training_pool("fashion-mnist", FASHION_TRAIN_IMAGES, seed=0)
    return images, labels


@functools.cache
def _fashion_hashes(height: int, width: int) -> frozenset[str]:
    return frozenset(content_hashes(list(_fashion_train()[0]), height, width, cached=False))


def _refuse_audited(source: str, arrays, context: BuildContext) -> None:
    pixels = context.audited_pixels
    if pixels is None:
        return
    shared = len(pixels.hashes & _fashion_hashes(pixels.height, pixels.width))
    if shared:
        raise AuditInputError(
            f"the disguise must be trained on public data the server holds, not on the "
            f"client's images: {shared} of the audited images are among the {source} images "
            f"it would train on; choose another public set ({', '.join(PUBLIC_SETS[1:])})"
        )


def _set_labels(source: str) -> list[int]:
    """The labels of the images ``public_images`` reads, in its order (0 where none)."""
    labels: list[int] = []
    chunk = 64
    for offset in range(0, PUBLIC_PRIORS[source], chunk):
        count = min(chunk, PUBLIC_PRIORS[source] - offset)
        read = load_sample_set(source, count, seed=0, offset=offset)
        labels += list(read.labels) if read.labels is not None else [0] * count
    return labels


# ---- the cache ---------------------------------------------------------------------------

_CACHE: dict[str, tuple[dict, dict, TrainingOutcome]] = {}


def cache_key(context: BuildContext, settings: DisguiseSettings, images: int) -> str:
    """SHA-256 of everything the trained server depends on."""
    digest = hashlib.sha256()
    digest.update(type(context.model).__qualname__.encode())
    for name, tensor in context.model.state_dict().items():
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    described = {
        "shape": context.input_shape,
        "images": images,
        "seed": context.seed,
        "training": context.training,
        "mean": list(context.normalization.mean),
        "std": list(context.normalization.std),
        "settings": dataclasses.asdict(settings),
    }
    digest.update(json.dumps(described, sort_keys=True).encode())
    return digest.hexdigest()


def _folder():
    return data_dir() / "cache" / "disguise"


def _to_disk(key: str, state: dict, decoder_state: dict, outcome: TrainingOutcome) -> None:
    from safetensors.torch import save_file

    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    tensors = {f"model.{k}": v.contiguous() for k, v in state.items()}
    tensors.update({f"decoder.{k}": v.contiguous() for k, v in decoder_state.items()})
    save_file(tensors, str(folder / f"{key}.safetensors"))
    (folder / f"{key}.json").write_text(json.dumps(dataclasses.asdict(outcome)))
    for suffix in (".safetensors", ".json"):
        private(folder / f"{key}{suffix}", 0o600)


def _from_disk(key: str, context, settings):
    from safetensors.torch import load_file

    folder = _folder()
    weights, scores = folder / f"{key}.safetensors", folder / f"{key}.json"
    if not (weights.exists() and scores.exists()):
        return None
    try:
        tensors = load_file(str(weights))
        outcome = TrainingOutcome(**json.loads(scores.read_text()))
    except (OSError, ValueError, TypeError):
        return None  # a damaged entry: train again
    state = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
    decoder_state = {k[8:]: v for k, v in tensors.items() if k.startswith("decoder.")}
    return state, decoder_state, outcome


def forget_cache() -> None:
    """Empty the in-process cache (tests)."""
    _CACHE.clear()


__all__ = [
    "MAX_MODEL_PARAMETERS",
    "PUBLIC_SETS",
    "DisguiseSettings",
    "DisguisedModification",
    "SecretDecoder",
    "build_disguise",
]

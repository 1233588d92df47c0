"""Shadow defense (Jiang, Ma, Yang, Medical Image Analysis 2025): the client attacks itself
with a "shadow" generator, then adds noise to its images where that attack succeeds.

Per client round (Algorithm of the paper, digest section 3.8):

1. pseudo update: the update the client would send on its clean batch (gradient or FedAvg
   weight difference) and the batch's BatchNorm statistics, what a BN-aware server recovers;
2. while ``round < shadow_rounds`` (T_s): fine-tune the shadow generator's synthesis layers
   for ``finetune_steps`` Adam steps on the attacker's loss (Eq. 6: per-layer update
   distance 1e-2, TV 1e-5, BN statistics 1e-2, image L2 1e2, MSE to the true images 1) from
   the per-image latents, so the shadow is a stronger-than-real attacker;
3. the noise map from its squared error (``shadow_noise.noise_map``), its momentum over
   rounds, the Grad-CAM++ foreground spared, the epoch-scaled amplitude;
4. the real update is computed on the noised images (``perturb_images``; the defended update
   is then that update unchanged); the generator keeps an EMA 0.5 of its fine-tuned weights.

Departure, stated in docs/ALGORITHMS.md: the paper's shadow is a StyleGAN3 pretrained on a
public set of the same modality, which cannot be had offline. Here the shadow is a small
convolutional decoder pretrained as a VAE decoder on the client's own local images (data the
auditor provides; the client holds them anyway), then per-image latents are fitted as in the
paper (Adam 1e-3, <= 500 steps, patience 5). ``shadow="prior"`` skips the generator and uses a
blur of the image as the shadow reconstruction (the paper's "w/o FT S" analogue, fast).
The state (generator, latents, momentum map) is kept per client, keyed by its images.

Why one module over 400 lines: the defense's generator, its shadow attack (Eq. 6) and the
per-client state are one mechanism, read against the paper in one file; the noise map and
its schedule, which are pure functions, are apart in ``shadow_noise.py``.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from auditlib.attacks.batchnorm_prior import BatchNormPrior
from auditlib.attacks.gradinversion import image_norm
from auditlib.attacks.grnn_generator import fit_to_input, generated_side
from auditlib.attacks.objectives import layer_l2_distance, total_variation
from auditlib.client.update import client_update, trainable_parameters
from auditlib.config import check_ranges, param, require
from auditlib.defenses.base import ClientContext, DefenseInfo, copied, register, require_context
from auditlib.defenses.shadow_noise import (
    CamMode,
    Schedule,
    amplitude,
    cam_influence,
    momentum_map,
    noise_map,
    perturbation,
    spare_foreground,
)
from auditlib.models.saliency import grad_cam_plus_plus, last_convolution
from auditlib.threat import KnownDefense


@dataclass(frozen=True)
class ShadowConfig:
    sigma0: float = param(
        0.19, "peak of the image noise at round 0, relative to the image's peak", low=0, high=10
    )
    schedule: Schedule = param(
        "increasing",
        "noise amplitude over the rounds: sigma0 exp(t / T) (increasing, the paper), constant, "
        "or sigma0 exp(-t / T)",
    )
    rounds: int = param(
        100,
        "T, the training length the schedule and the CAM weight are scaled to",
        low=1,
        high=100_000,
    )
    shadow_rounds: int = param(
        20, "T_s: the shadow is fine-tuned before this round, frozen after", low=0, high=100_000
    )
    temperature: float = param(
        20.0, "tau, the temperature of the three softmaxes", low=0, low_open=True, high=1000
    )
    equalize: bool = param(True, "equalise the histogram of the inverted reconstruction error")
    momentum: float = param(
        0.9, "weight of the new noise map in the momentum map over rounds", low=0, high=1
    )
    cam: CamMode = param(
        "paper",
        "how the Grad-CAM++ foreground is spared: the paper's prose (scaled down by 1 - alpha "
        "CAM), the authors' code (a softmax offset), or off",
    )
    cam_layer: str | None = param(
        None, "module name of the Conv2d the CAM is taken at; empty: the last one"
    )
    cam_top: float = param(
        0.3, "share of the CAM, largest first, counted as foreground", low=0, low_open=True, high=1
    )
    cam_min: float = param(
        0.1, "lower clip of the CAM weight alpha_t = clip(t / T, cam_min, cam_max)", low=0, high=1
    )
    cam_max: float = param(
        0.5, "upper clip of the CAM weight alpha_t (at least cam_min)", low=0, high=1
    )
    shadow: Literal["generator", "prior"] = param(
        "generator",
        "the shadow attacker: a generator pretrained on the client's images and fine-tuned, "
        "or a blur of the image (prior: fast, no fine-tuning)",
    )
    latent_dim: int = param(64, "length of the generator's latent per image", low=1, high=1024)
    width: int = param(32, "channels of the generator's last block", low=1, high=256)
    pretrain_steps: int = param(
        300, "VAE pretraining steps of the generator on the client's images", low=0, high=100_000
    )
    latent_steps: int = param(
        500, "Adam steps at most fitting each image's latent", low=0, high=100_000
    )
    latent_lr: float = param(1e-3, "Adam step size of the latent fit", low=0, low_open=True, high=1)
    patience: int = param(
        5, "latent fit: steps without improvement before it stops", low=1, high=10_000
    )
    finetune_steps: int = param(
        5,
        "Adam steps on the synthesis layers per round (before shadow_rounds)",
        low=0,
        high=100_000,
    )
    finetune_lr: float = param(
        1e-3, "Adam step size of the fine-tuning", low=0, low_open=True, high=1
    )
    ema: float = param(
        0.5, "weight of the fine-tuned generator in the one kept (EMA)", low=0, high=1
    )
    update_weight: float = param(
        1e-2, "lambda_g, fine-tuning loss: weight of the per-layer update distance", low=0, high=1e6
    )
    tv: float = param(1e-5, "fine-tuning loss: weight of total variation", low=0, high=1e6)
    bn: float = param(
        1e-2, "fine-tuning loss: weight of the BatchNorm-statistics prior", low=0, high=1e6
    )
    l2: float = param(1e2, "fine-tuning loss: weight of the image L2 norm", low=0, high=1e6)
    mse: float = param(
        1.0, "fine-tuning loss: weight of the MSE to the true images", low=0, high=1e6
    )

    def __post_init__(self) -> None:
        check_ranges(self)
        require(
            self.cam_min <= self.cam_max,
            f"expected 0 <= cam_min <= cam_max <= 1, got {self.cam_min} and {self.cam_max}",
        )


# --- The shadow generator -------------------------------------------------------------------


class ShadowGenerator(nn.Module):
    """A small decoder: ``mapping`` (latent -> 4x4 map, frozen after pretraining, like
    StyleGAN's mapping network) then ``synthesis`` (upsample + conv blocks to the image).

    No BatchNorm, so each image's reconstruction depends on its own latent only; the output
    is linear, in the model's normalised space.
    """

    def __init__(self, latent_dim: int, channels: int, side: int, width: int) -> None:
        super().__init__()
        blocks = int(math.log2(side)) - 2  # 4 x 4 doubled `blocks` times
        base = width * 2 ** (blocks - 1)
        self.mapping = nn.Linear(latent_dim, base * 16)
        layers: list[nn.Module] = []
        for b in range(blocks):
            in_ch, out_ch = base // 2**b, max(base // 2 ** (b + 1), width)
            layers += [
                nn.Upsample(scale_factor=2, mode="nearest"),
                nn.Conv2d(in_ch, out_ch, 3, padding=1),
                nn.LeakyReLU(0.2),
            ]
        layers.append(nn.Conv2d(max(base // 2**blocks, width), channels, 3, padding=1))
        self.synthesis = nn.Sequential(*layers)
        self.base = base

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        x = self.mapping(latent).view(latent.shape[0], self.base, 4, 4)
        return self.synthesis(F.leaky_relu(x, 0.2))


def _generate(net: ShadowGenerator, latents: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return fit_to_input(net(latents), shape[-2], shape[-1], "resize")


def pretrain_generator(
    images: torch.Tensor, config: ShadowConfig, generator: torch.Generator
) -> ShadowGenerator:
    """A VAE on the client's images (flat linear encoder, the shadow as decoder); the decoder
    is kept, so latents drawn from N(0, I) decode to plausible images of this client."""
    channels, height, width = images.shape[1:]
    side = generated_side(height, width)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):  # PyTorch's init draws from the global RNG
        torch.manual_seed(seed)
        decoder = ShadowGenerator(config.latent_dim, channels, side, config.width)
        encoder = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * height * width, 256),
            nn.ReLU(),
            nn.Linear(256, 2 * config.latent_dim),
        )
    decoder, encoder = decoder.to(images.device), encoder.to(images.device)
    optimizer = torch.optim.Adam([*decoder.parameters(), *encoder.parameters()], lr=1e-3)
    batch = min(64, images.shape[0])
    for _ in range(config.pretrain_steps):
        index = torch.randint(0, images.shape[0], (batch,), generator=generator)
        x = images[index.to(images.device)]
        mean, log_var = encoder(x).chunk(2, dim=1)
        eps = torch.randn(mean.shape, generator=generator).to(images.device)
        z = mean + torch.exp(0.5 * log_var) * eps
        reconstruction = F.mse_loss(_generate(decoder, z, x.shape), x, reduction="sum") / batch
        kl = -0.5 * torch.sum(1 + log_var - mean.pow(2) - log_var.exp()) / batch
        optimizer.zero_grad(set_to_none=True)
        (reconstruction + kl).backward()
        optimizer.step()
    return decoder.requires_grad_(False)


def fit_latents(
    net: ShadowGenerator, images: torch.Tensor, config: ShadowConfig, generator: torch.Generator
) -> torch.Tensor:
    """Per-image latents from N(0, I) fitted by MSE with the generator frozen; stops early when
    the loss has not improved for ``patience`` steps (on purpose: only coarse structure)."""
    latents = torch.randn(images.shape[0], config.latent_dim, generator=generator)
    latents = latents.to(images.device).requires_grad_(True)
    optimizer = torch.optim.Adam([latents], lr=config.latent_lr)
    best, stale = math.inf, 0
    for _ in range(config.latent_steps):
        loss = F.mse_loss(_generate(net, latents, images.shape), images)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = float(loss.detach())
        if value < best - 1e-7:
            best, stale = value, 0
        else:
            stale += 1
            if stale >= config.patience:
                break
    return latents.detach()


# --- The shadow attack (Eq. 6) ----------------------------------------------------------------


def _batch_statistics(prior: BatchNormPrior) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [tuple(t.detach() for t in prior.captured[i]) for i in sorted(prior.captured)]


def finetune_shadow(
    net: ShadowGenerator,
    latents: torch.Tensor,
    context: ClientContext,
    config: ShadowConfig,
) -> ShadowGenerator:
    """A copy of ``net`` whose synthesis layers took ``finetune_steps`` Adam steps on the
    shadow attacker's loss against the client's own pseudo update and batch statistics."""
    model, images, labels, protocol = (
        context.model,
        context.images,
        context.labels,
        context.protocol,
    )
    parameters = trainable_parameters(model)
    prior = BatchNormPrior(model) if config.bn > 0 else None
    if prior is not None and len(prior) == 0:
        prior = None
    with prior.attached() if prior is not None else contextlib.nullcontext():
        target = client_update(model, parameters, images, labels, protocol, differentiable=False)
        if prior is not None:
            prior.targets = _batch_statistics(prior)
        tuned = copy.deepcopy(net)
        tuned.synthesis.requires_grad_(True)
        optimizer = torch.optim.Adam(tuned.synthesis.parameters(), lr=config.finetune_lr)
        pixels = images.shape[-1] * images.shape[-2]
        for _ in range(config.finetune_steps):
            shadow = _generate(tuned, latents, images.shape)
            if prior is not None:
                prior.reset()
            simulated = client_update(
                model, parameters, shadow, labels, protocol, differentiable=True
            )
            loss = config.update_weight * layer_l2_distance(simulated, target)
            loss = loss + config.tv * total_variation(shadow)
            loss = loss + config.l2 * image_norm(shadow) / pixels**2
            loss = loss + config.mse * F.mse_loss(shadow, images)
            if prior is not None:
                loss = loss + config.bn * prior.loss(shadow)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return tuned.requires_grad_(False)


def _ema(kept: ShadowGenerator, tuned: ShadowGenerator, weight: float) -> None:
    with torch.no_grad():
        for k, t in zip(kept.parameters(), tuned.parameters(), strict=True):
            k.mul_(1 - weight).add_(weight * t)


def blurred(images: torch.Tensor, sigma: float = 2.0) -> torch.Tensor:
    """Gaussian blur per channel (the prior-only shadow: coarse structure, no update used)."""
    radius = max(1, int(3 * sigma))
    x = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    kernel = torch.exp(-(x**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    channels = images.shape[1]
    flat = images.reshape(-1, 1, *images.shape[-2:])
    flat = F.conv2d(F.pad(flat, (radius, radius, 0, 0), mode="replicate"), kernel.view(1, 1, 1, -1))
    flat = F.conv2d(F.pad(flat, (0, 0, radius, radius), mode="replicate"), kernel.view(1, 1, -1, 1))
    return flat.view(-1, channels, *images.shape[-2:])


# --- The defense ------------------------------------------------------------------------------


@dataclass
class ShadowState:
    """What one client keeps between rounds."""

    generator: ShadowGenerator | None = None
    latents: torch.Tensor | None = None
    momentum: torch.Tensor | None = None


def client_key(images: torch.Tensor) -> str:
    """A client's identity for its shadow state: the digest of its private images."""
    return hashlib.sha256(images.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def invert_shadow(
    config: ShadowConfig,
    recovered: torch.Tensor,
    labels: torch.Tensor | None,
    knowledge: Any,
    seed: int = 0,
) -> torch.Tensor:
    """The adaptive attacker's estimate of the client's images from its recovery x' of the
    perturbed ones: x' minus the level of delta, per image. delta is never negative and its
    level is stable, so the attacker estimates it by running Shadow (the same code, a fresh
    shadow of its own, its own seed) on x' as the client ran it in the audited round (0).
    Its pattern is not recoverable this way: the histogram equalisation makes it a
    near-random function of the image (docs/ALGORITHMS.md), so x = x' - delta(x) solved by
    fixed-point iteration moves away from x. Model space in and out (CPU)."""
    model = knowledge.model
    device = knowledge.device
    observed = recovered.detach().to(device)
    # Shadow runs on images (the client's: valid pixels). A recovery far outside them (a
    # start of DLG that did not converge: values whose squared error overflowed) made its
    # noise map NaN, and the run failed; the attacker simulates the client on its recovery
    # within the pixel range it knows.
    low, high = knowledge.normalization.pixel_bounds(observed)
    simulated = torch.maximum(torch.minimum(observed, high), low)
    if labels is None:  # the attack recovered no labels: the model's own reading
        with torch.no_grad():
            labels = model(simulated).argmax(dim=-1)
    labels = labels.to(device).long()
    parameters = {n: p.detach() for n, p in knowledge.parameters().items()}
    context = ClientContext(model, parameters, simulated, labels, knowledge.protocol, round=0)
    shadow = Shadow(config)  # no state from the client's shadow: it is private
    delta = shadow.perturb_images(context, torch.Generator().manual_seed(seed)) - simulated
    return (observed - delta.mean(dim=(1, 2, 3), keepdim=True)).cpu()


class Shadow:
    def __init__(self, config: ShadowConfig) -> None:
        self.config = config
        self.states: dict[str, ShadowState] = {}
        self.last: dict[str, torch.Tensor] = {}  # the last round's maps, for display and tests

    def shadow_reconstruction(
        self, context: ClientContext, state: ShadowState, generator: torch.Generator
    ) -> torch.Tensor:
        """The shadow's reconstruction of the client's batch this round (updates ``state``)."""
        config, images = self.config, context.images
        if config.shadow == "prior":
            return blurred(images)
        if state.generator is None:
            state.generator = pretrain_generator(images, config, generator)
            state.latents = fit_latents(state.generator, images, config, generator)
        assert state.latents is not None
        net = state.generator
        if context.round < config.shadow_rounds and config.finetune_steps > 0:
            tuned = finetune_shadow(net, state.latents, context, config)
            with torch.no_grad():
                reconstruction = _generate(tuned, state.latents, images.shape)
            _ema(net, tuned, config.ema)
            return reconstruction
        with torch.no_grad():
            return _generate(net, state.latents, images.shape)

    def perturb_images(self, context: ClientContext, generator: torch.Generator) -> torch.Tensor:
        """The client's images with the Shadow noise added (what its real update is taken on)."""
        config = self.config
        context = require_context(context, "shadow")
        images = context.images.detach()
        state = self.states.setdefault(client_key(images), ShadowState())
        self.last = {}
        if context.round >= config.shadow_rounds and state.momentum is not None:
            noise = state.momentum  # after T_s the stored map is reused
        else:
            reconstruction = self.shadow_reconstruction(context, state, generator)
            error = (reconstruction - images).pow(2)
            noise = noise_map(error, config.temperature, config.equalize)
            # While the shadow trains the fresh map is applied; the momentum map is kept.
            state.momentum = momentum_map(noise, state.momentum, config.momentum)
            self.last["error"] = error
        alpha = cam_influence(context.round, config.rounds, config.cam_min, config.cam_max)
        cam = torch.zeros(images.shape[0], *images.shape[-2:], device=images.device)
        if config.cam != "off":
            layer = config.cam_layer or last_convolution(context.model)
            cam = grad_cam_plus_plus(context.model, images, context.labels, layer)
        spared = spare_foreground(
            noise,
            cam,
            alpha,
            top=config.cam_top,
            mode=config.cam,
            temperature=config.temperature,
        )
        sigma = amplitude(config.sigma0, context.round, config.rounds, config.schedule)
        delta = perturbation(images, spared, sigma)
        self.last |= {"noise": noise, "cam": cam, "delta": delta}
        return images + delta

    def apply(self, update, generator, context=None):
        # The defense acted on the images; the update taken on them leaves unchanged.
        return copied(update)

    def known_to_attacker(self, observation, weights):
        c = self.config
        return KnownDefense(
            "shadow",
            f"knows Shadow's mechanism and settings (sigma0 {c.sigma0:g}, {c.schedule} "
            f"schedule, shadow={c.shadow}, round 0) but not the client's images, shadow or "
            "randomness: takes its recovery as the perturbed images and subtracts the "
            "perturbation's level, estimated by running Shadow on them with a shadow of its "
            "own (the perturbation's pattern cannot be re-run: it changes with the image)",
            postprocess=lambda images, labels, knowledge: invert_shadow(
                c, images, labels, knowledge
            ),
        )

    def privacy_report(self) -> dict[str, Any]:
        return {
            "epsilon": None,
            "epsilon_unavailable_reason": "Shadow adds a deterministic, data-dependent "
            "perturbation to the images; it is an empirical defense with no DP guarantee",
            "shadow": self.config.shadow,
        }


register(
    DefenseInfo(
        "shadow",
        "Shadow defense: the client inverts its own update with a shadow generator and adds "
        "noise to its images where that reconstruction succeeds, sparing the Grad-CAM++ "
        "foreground; `sigma0` is the strength.",
        ShadowConfig,
        Shadow,
        strength="sigma0",
    )
)

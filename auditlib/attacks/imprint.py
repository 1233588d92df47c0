"""The malicious server's read-backs: Robbing the Fed (``rtf``), Curious Abandon Honesty
(``cah``) and LOKI (``loki``), each a closed form on the update of the layer the server put
in front of the model (``auditlib.server``).

A row r of that layer, fed pixels u_s, gets the update sum over the images that fire it of
delta_s u_s (weights) and delta_s (bias), delta_s being image s's gradient at the row's
output, the same for every row (the block's identical columns). So

- ``rtf``: row k fires for every image brighter than threshold k; rows k and k + 1 differ by
  the images of bin k, and an image alone in its bin is (W_k - W_k+1) / (b_k - b_k+1),
  exactly (Fowl et al., ICLR 2022);
- ``cah``: a trap row fired by one image alone holds it as W_r / b_r (Boenisch et al.,
  EuroS&P 2023); the attacker keeps the read-backs that several rows agree on;
- ``loki``: ``rtf`` within each client's block of rows; in the sum of many clients' updates
  the block is one client's alone, so each image is also attributed (Zhao et al., S&P 2024).

The scale of the update (a learning rate, FedAvg's local steps, secure aggregation's
weighting) cancels in each ratio; with several local steps the thresholds move by the
learning rate times the rows' update, which the read-back neglects (docs/ALGORITHMS.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from auditlib.attacks.base import ADAPTIVE_PARTS, AttackInfo, AuditPreset, Clock, ProgressEvent
from auditlib.errors import AttackUnsupportedError
from auditlib.reconstruction import Candidate, Reconstruction
from auditlib.server.modification import ServerModification
from auditlib.threat import AttackerKnowledge, KnownDefense, Observation

# A bin counts as holding images when its bias difference exceeds this share of the largest:
# float32 sums of up to B images leave differences of empty bins near 1e-7 of it.
EMPTY_BIN = 1e-5
# Where the attacker knows the noise on each entry (the twin), a bin counts as holding images
# when its step stands this many of its noise's standard deviations from zero: a bin of
# noise alone passes with probability 6e-5, and below it the read-back's per-pixel error,
# sqrt(2) s / step, is already above the ~0.25 a flat grey guess makes on an image.
NOISE_STEPS = 4.0
LOSS_NAME = "images_not_read_back"


@dataclass(frozen=True, eq=False)
class ReadBack:
    """Images read off the block's update, in pixels (N x C x H x W), with the client each
    came from (LOKI; None where the attack does not attribute) and the attacker's own
    confidence in each (rows agreeing on it for ``cah``, a bin's signal over the noise)."""

    pixels: torch.Tensor
    clients: tuple[int, ...] | None
    support: tuple[float, ...]


@dataclass(frozen=True, eq=False)
class BlockUpdate:
    """The inserted layer's update as observed: float32 weights (less the weights sent,
    row by row, where the observation is weights) and float64 biases. Rows are read one at
    a time: the whole layer in float64 is 600 MB at 224 px and 512 rows."""

    weight: torch.Tensor
    bias: torch.Tensor  # float64, the update
    sent: torch.Tensor | None  # the weights sent, where the observation is the new weights

    def row(self, k: int) -> torch.Tensor:
        row = self.weight[k].double()
        return row if self.sent is None else row - self.sent[k].double()

    def row_sums(self) -> torch.Tensor:
        sums = self.weight.sum(dim=1).double()
        return sums if self.sent is None else sums - self.sent.sum(dim=1).double()


def block_update(observation: Observation, knowledge: AttackerKnowledge) -> BlockUpdate:
    """The inserted layer's weight and bias updates (the weights the client returned less
    the weights sent, where the observation is weights)."""
    server = _server(knowledge)
    weight_name, bias_name = server.parameter_names
    names = observation.parameter_names
    if weight_name not in names or bias_name not in names:
        raise AttackUnsupportedError(
            f"the update has no {weight_name!r}: the client did not train the model the "
            "server sent (or a defense removed that layer's update)"
        )
    # A layer with 4-D weights (an evading server's whole-input Conv2d) is its rows flat; an
    # evading server's decoy rows, after its own, are never read.
    read = slice(0, observation.tensors[names.index(bias_name)].shape[0] - server.decoys)
    weight = observation.tensors[names.index(weight_name)].flatten(1)[read]
    bias = observation.tensors[names.index(bias_name)].double()[read]
    sent = None
    if observation.kind == "weights":
        parameters = dict(knowledge.model.named_parameters())
        sent = parameters[weight_name].detach().flatten(1)[read]
        bias = bias - parameters[bias_name].detach().double()[read]
    return BlockUpdate(weight, bias, sent)


def noise_floor(observation: Observation, knowledge: AttackerKnowledge) -> float:
    """Where a FedAvg update of the inserted rows is lost in float32's rounding: the sent
    weights' largest magnitude times 2^-23, times a margin of 64 (a difference of two rows
    carries the rounding of several steps); 0 for a gradient, which adds to nothing."""
    if observation.kind == "gradient":
        return 0.0
    weight_name, _ = _server(knowledge).parameter_names
    sent = dict(knowledge.model.named_parameters())[weight_name]
    return float(sent.detach().abs().max()) * 2.0**-23 * 64


def _server(knowledge: AttackerKnowledge) -> ServerModification:
    if knowledge.server is None:
        raise AttackUnsupportedError(
            "this attack reads the layer a malicious server put in the model; under the "
            "honest-but-curious threat model there is none"
        )
    return knowledge.server


def read_bins(
    update: BlockUpdate,
    first: int,
    thresholds: tuple[float, ...],
    by_bias: bool,
    noise_floor: float = 0.0,
    entry_noise: float = 0.0,
    pixels: bool = True,
) -> list[tuple[float, torch.Tensor]]:
    """Rows ``first``.. hold ``thresholds`` (ascending): each non-empty bin's read-back (its
    evidence: how far its step, the difference of its row's and the next row's biases (or
    sums), stands above the empty bins', which is the sum of the deltas of the images in it;
    the flat pixels of those images, weighted by their deltas, in [0, 1]). A bin is empty
    when its difference is within ``noise_floor`` (float32's rounding of the weights the
    client added its update to), or, where the attacker knows the noise's standard deviation
    on each entry (``entry_noise``), within ``NOISE_STEPS`` of its step's. Under noise every
    bin's step is non-zero: the evidence, not the bin's index, decides which the attacker
    keeps (``candidate_of``).

    ``by_bias``: the weights' difference over the biases' (exact for one image); the bins
    holding images are those whose bias difference is not zero. Otherwise (FedAvg) the
    biases' update is below float32's resolution of the biases the client adds it to: the
    bins are found from the rows' sums, and each weights' difference is scaled to the
    brightness at the middle of its bin (off by at most half a bin's width over the
    brightness). Only the rows of bins that hold images are read.

    ``pixels``: the rows read pixels, so each read-back is clipped to [0, 1]; False (rows
    reading a convolution's output, which the attack inverts) leaves it as read."""
    count = len(thresholds)
    size = update.weight.shape[1]
    if by_bias:
        marks = update.bias[first : first + count]
        marks_floor = 0.0
        step_noise = entry_noise * 2**0.5  # the difference of two noised biases
    else:
        marks = update.row_sums()[first : first + count]
        marks_floor = noise_floor * size**0.5  # rounding errors add up like a random walk
        step_noise = entry_noise * (2 * size) ** 0.5  # of two noised sums of ``size`` entries
    steps = marks - torch.cat([marks[1:], marks.new_zeros(1)])  # bin k: row k less row k + 1
    scale = float(steps.abs().max()) if steps.numel() else 0.0
    if scale == 0.0:
        return []
    floor = max(EMPTY_BIN * scale, marks_floor, NOISE_STEPS * step_noise)
    found = (steps.abs() > floor).nonzero().flatten().tolist()
    middles = bin_middles(thresholds)
    reads = []
    for k in found:
        row = update.row(first + k)
        dw = row - update.row(first + k + 1) if k + 1 < count else row
        if float(dw.abs().max()) <= noise_floor:
            continue
        # The bin's evidence: its step over what an empty bin's could be.
        strength = abs(float(steps[k])) / max(EMPTY_BIN * scale, marks_floor, step_noise)
        if by_bias:
            read = dw / float(steps[k])
        elif float(dw.mean()) != 0:
            read = dw * (middles[k] / float(dw.mean()))
        else:
            continue
        reads.append((strength, read.clamp(0, 1) if pixels else read))
    return reads


def bin_middles(thresholds: tuple[float, ...]) -> list[float]:
    """The brightness at the middle of each bin; the open ends take their neighbour's width."""
    t = list(thresholds)
    if len(t) == 1:
        return [min(max(t[0] + 0.25, 0.0), 1.0)]
    edges = [t[1] - (t[2] - t[1] if len(t) > 2 else 0.1), *t[1:], t[-1] + (t[-1] - t[-2])]
    edges[0] = max(edges[0], t[0])
    return [min(max((edges[k] + edges[k + 1]) / 2, 0.0), 1.0) for k in range(len(t))]


def candidate_of(read: ReadBack, knowledge: AttackerKnowledge, stop: str) -> tuple[Candidate, int]:
    """The attacker's B images: its read-backs, most supported first, then the prior's
    brightness as a flat image where fewer came back; and how many were read back."""
    batch = knowledge.batch_size
    order = sorted(range(len(read.support)), key=lambda i: -read.support[i])[:batch]
    shape = (batch, *knowledge.input_shape)
    server = knowledge.server
    grey = server.prior.mean if server is not None and server.prior is not None else 0.5
    pixels = torch.full(shape, grey, dtype=torch.float64)
    clients = [-1] * batch
    for slot, i in enumerate(order):
        pixels[slot] = read.pixels[i].cpu()
        if read.clients is not None:
            clients[slot] = read.clients[i]
    missing = batch - len(order)
    attributed = None if read.clients is None else tuple(clients)
    candidate = Candidate(
        _to_model(pixels, knowledge), None, float(missing), 0, 1, stop, clients=attributed
    )
    return candidate, len(order)


def _to_model(pixels: torch.Tensor, knowledge: AttackerKnowledge) -> torch.Tensor:
    mean = torch.tensor(knowledge.normalization.mean, dtype=torch.float64).view(1, -1, 1, 1)
    std = torch.tensor(knowledge.normalization.std, dtype=torch.float64).view(1, -1, 1, 1)
    return ((pixels - mean) / std).float()


def single_event(
    read: ReadBack, knowledge: AttackerKnowledge, clock: Clock, inference: dict
) -> Iterator[ProgressEvent]:
    """The one event of a closed-form attack: its candidate, as the loop's final event."""
    stop = "cancelled" if clock.control.is_cancelled() else "completed"
    candidate, found = candidate_of(read, knowledge, stop)
    final = Reconstruction((candidate,), stop, 1, {**inference, "images_read_back": found})
    yield ProgressEvent(
        1, 1, clock.elapsed, {LOSS_NAME: candidate.loss}, 0, candidate.images, None, final
    )


def binning_twin(name: str):
    """The rule of a binning server's twin (``AttackInfo.server_twin``): it knows noise of a
    known scale on every entry (it scales its block against it, ``server.blocks
    .scale_against_noise``, and keeps the bins whose step stands above it) and a rescaling of
    the whole update (a norm clip, which cancels in the read-back's ratio, so alone it leaves
    the plain attack); no other part of a defense."""

    def rule(known: KnownDefense) -> tuple[str | None, bool]:
        parts = known.needs()
        noise = "distance" in parts or "likelihood" in parts
        takes = (
            parts <= {"distance", "likelihood", "transform"}
            and (not noise or known.entry_noise_std is not None)
            and ("transform" not in parts or known.rescales)
        )
        if not takes:
            return (
                f"{name}'s server adapts only to noise of a known scale on every entry and "
                f"to norm clipping, not to {known.name}'s "
                f"{' or '.join(ADAPTIVE_PARTS[p] for p in sorted(parts))}",
                False,
            )
        return None, not noise

    return rule


def server_attack(
    name: str,
    summary: str,
    config_type: type,
    run,
    build,
    paper: dict,
    audit: dict,
    why: str,
    twin=None,
    stands_in_for: frozenset[str] = frozenset(),
) -> AttackInfo:
    """The registry entry of a malicious server's attack: a closed form (one pass, budget 1)
    that applies only where the server built its own model and weighs no image prior; its
    twin, where it has one, follows ``twin`` (``AttackInfo.server_twin``; None: it adapts to
    no defense); an evading server names the built servers it stands in for under a model
    check (``AttackInfo.stands_in_for``)."""

    def needs_its_model(observation: Observation, knowledge: AttackerKnowledge) -> str | None:
        if knowledge.server is None or knowledge.server.attack != name:
            return (
                f"{name} needs a malicious server (threat model 'malicious'): it changes the model"
            )
        return None

    return AttackInfo(
        name=name,
        summary=summary,
        config_type=config_type,
        run=run,
        presets={"paper": paper},
        audit=AuditPreset(audit, iterations=1, why=why),
        paper_iterations=1,
        not_applicable=needs_its_model,
        adapts=frozenset(),
        weighs_prior=False,
        builds=build,
        closed_form=True,
        server_twin=twin,
        stands_in_for=stands_in_for,
    )

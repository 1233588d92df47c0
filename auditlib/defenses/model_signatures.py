"""The signatures of a malicious server's model, read from the weights a client receives.

Each check looks at one layer (or, for the last, at the model run on the client's own
batch) and returns a :class:`Finding` or None. They know nothing of what a server built
(this module imports neither ``auditlib.server`` nor ``auditlib.attacks``): they test for
the structure the published attacks need, which an honestly initialised or trained layer
does not have. The thresholds are named below with why each sits where it does; the
benchmark ``benchmarks/model_check.py`` records how far honest models stay from them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

# A layer is judged only with enough rows that "most rows" means something: a head of 2
# classes never looks like a bank of bins.
MIN_ROWS = 8
# Two rows share a direction when |cosine| exceeds this. Independent rows of an honest layer
# have |cosine| of order 1 / sqrt(features); two random directions in 8 dimensions (the
# fewest features judged, MIN_FEATURES) pass 0.99 with chance 3e-7. An imprint's rows
# are parallel to float precision (|cosine| = 1).
PARALLEL = 0.99
MIN_FEATURES = 8
# A shared direction is a group of at least this many rows (bins come by the dozen).
MIN_GROUP = 4
# "Most rows": the share of a layer's rows a signature must hold before it is reported.
MOST = 0.5
# Graded biases: within the shared directions, at least this share of rows has a threshold
# (bias over the row's length) of its own. Bins need distinct thresholds; rows that are
# copies of each other with one bias (a constant initialisation) are not an imprint.
DISTINCT_THRESHOLDS = 0.9
# Trap rows mirror: the positive weights are c times the negative magnitudes, as multisets
# (``mirror_errors``). Float32 rounding of c * m leaves a relative error near 1e-7; two
# independent halves of an honest row differ by order 1 / sqrt(features) (about 1e-3 at
# 786k features, the most a built-in model takes), so 1e-4 sits between them.
MIRROR_TOLERANCE = 1e-4
# Rows looked at closely (the imprint's first look, the trap's mirror test): a layer with
# most rows of a kind shows it in some of 16 (all miss with chance 2^-16).
SAMPLE = 16
# A trap row's weights sum far below zero: z = sum(w) / (sqrt(features) * std(w)) is about
# N(0, 1) across honest rows; trap rows reach -0.02 sqrt(features) (scale 0.95, -8 at
# 224 x 224 x 3 inputs). A layer is flagged when its median row has z below -6.
TRAP_SUM_Z = 6.0
# SEER's transmit ratio of a kernel: its largest |weight| over the sum of its other
# |weights|. SEER never saw an honest first layer above 1; a kernel that is one tap (LOKI's
# client kernels) has an infinite ratio. A layer transmits when every non-zero kernel is
# above 10, i.e. one tap carries ten times more than all the others together.
TRANSMIT_RATIO = 10.0
# Kernels of fewer taps (a 1x1 convolution on one channel) cannot be judged.
MIN_TAPS = 4
# Identical columns: every column within this of the first (relative to the largest weight).
# Only float rounding would leave them apart; honest columns differ by the weights' scale.
IDENTICAL = 1e-6
# One sample dominating (data-driven, SEER's per-sample check): of a ReLU layer's units that
# fire on the batch, the share fired by one image alone must reach EXTREME while SILENT of
# all its units fire for none. An honest layer at initialisation fires each unit for about
# half the images (single share 8 * 2^-8 / (1 - 2^-8), about 3 %, at 8 images); only a layer
# whose units each fire for about 5 % of images or fewer reaches both.
EXTREME = 0.8
SILENT = 0.5
MIN_UNITS = 32


@dataclass(frozen=True)
class Finding:
    """One signature seen in one layer: which, where, in plain words, and its statistic."""

    signature: str  # "imprint", "trap", "transmit" or "dominance"
    layer: str
    text: str
    statistic: float


def linear_layers(model: nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor | None]]:
    """Every 2-D weight (rows x features) with its bias, by layer name."""
    parameters = dict(model.named_parameters())
    found = []
    for name, weight in parameters.items():
        if weight.ndim != 2 or not name.endswith("weight"):
            continue
        layer = name[: -len("weight")].rstrip(".")
        bias = parameters.get(f"{layer}.bias" if layer else "bias")
        if bias is not None and bias.shape != weight.shape[:1]:
            bias = None
        found.append((layer, weight.detach(), None if bias is None else bias.detach()))
    return found


def kernel_layers(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every weight of 3 or more dimensions (convolutions: out x in x taps)."""
    return [
        (name[: -len(".weight")], w.detach())
        for name, w in model.named_parameters()
        if w.ndim >= 3 and name.endswith(".weight")
    ]


def shared_directions(layer: str, weight: torch.Tensor, bias: torch.Tensor | None):
    """Robbing the Fed's imprint, LOKI's bins: most rows parallel (within each group of a
    block), their biases graded. Rows are grouped greedily: the first row not yet in a group
    and every row parallel to it; stops once the rows left alone outnumber what "most"
    allows."""
    rows = weight.shape[0]
    if rows < MIN_ROWS or weight.shape[1] < MIN_FEATURES or bias is None:
        return None
    w = weight.float()
    norms = w.norm(dim=1)
    live = (norms > 0).nonzero().flatten()
    if len(live) == 0:
        return None
    # A cheap look first: if most rows were grouped, some of SAMPLE random rows (seeded, so
    # the check repeats) would each have MIN_GROUP parallel rows; all miss with chance
    # 2^-SAMPLE. One product of SAMPLE columns, where grouping an honest layer costs rows / 2.
    pick = live[torch.randperm(len(live), generator=torch.Generator().manual_seed(0))[:SAMPLE]]
    cosine = (w @ w[pick].T) / (norms.unsqueeze(1) * norms[pick]).clamp_min(1e-30)
    if int(((cosine.abs() > PARALLEL).sum(0) >= MIN_GROUP).sum()) == 0:
        return None
    free = norms > 0
    groups: list[tuple[torch.Tensor, torch.Tensor]] = []
    alone = int((~free).sum())
    while bool(free.any()) and alone <= (1 - MOST) * rows:
        first = int(free.nonzero()[0])
        cosine = (w @ w[first]) / (norms * norms[first]).clamp_min(1e-30)
        members = free & (cosine.abs() > PARALLEL)
        free &= ~members
        if int(members.sum()) >= MIN_GROUP:
            groups.append((members.nonzero().flatten(), torch.sign(cosine)))
        else:
            alone += int(members.sum())
    grouped = sum(len(g) for g, _ in groups)
    if grouped < MOST * rows:
        return None
    # A row's threshold: where along its direction it starts to fire (bias over length,
    # signed by the row's orientation against the group's first row).
    distinct = 0
    for group, sign in groups:
        thresholds = bias[group].double() * sign[group] / norms[group]
        scale = float(thresholds.abs().max()) or 1.0
        distinct += len(torch.unique(torch.round(thresholds / scale * 1e9)))
    if distinct < DISTINCT_THRESHOLDS * grouped:
        return None
    where = "one direction" if len(groups) == 1 else f"{len(groups)} directions (one per block)"
    return Finding(
        "imprint",
        layer,
        f"layer {layer}: {grouped} of {rows} rows share {where}, with graded biases (an imprint)",
        grouped / rows,
    )


def trap_weights(layer: str, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """Curious Abandon Honesty's trap rows: each row's positive weights are the mirror of its
    negative ones times a factor below 1 (the mirror error, below), or most rows sum far
    below zero (the median z of the row sums, ``TRAP_SUM_Z``)."""
    rows, features = weight.shape
    if rows < MIN_ROWS or features < MIN_FEATURES:
        return None
    w = weight.float()
    variance, mean = torch.var_mean(w, dim=1)
    spread = variance.double().sqrt()
    z = torch.where(spread > 0, mean.double() * math.sqrt(features) / spread, 0)
    median_z = float(z.median())
    # As many positive weights as negative ones (exact in float32 up to 2^24 features).
    balanced = ((torch.sign(w).sum(1) == 0) & (variance > 0)).nonzero().flatten()
    if len(balanced) >= MOST * rows:
        # The mirror error on SAMPLE rows spread evenly over the balanced ones.
        step = max(1, len(balanced) // SAMPLE)
        checked = balanced[::step][:SAMPLE]
        mirrors = int((mirror_errors(w[checked]) < MIRROR_TOLERANCE).sum())
        if len(balanced) * mirrors >= MOST * rows * len(checked):  # most rows, estimated
            return Finding(
                "trap",
                layer,
                f"layer {layer}: trap weights: {len(balanced)} of {rows} rows have as many "
                f"negative weights as positive ones, and in {mirrors} of the {len(checked)} "
                "checked the positive weights mirror the negative ones, scaled down",
                len(balanced) / rows * mirrors / len(checked),
            )
    if median_z < -TRAP_SUM_Z:
        return Finding(
            "trap",
            layer,
            f"layer {layer}: its rows' weights sum far below zero (median z {median_z:.1f}): "
            "trap weights",
            -median_z,
        )
    return None


def mirror_errors(rows: torch.Tensor) -> torch.Tensor:
    """How far each row is from a trap row: with P the row's positive weights, N its
    negative magnitudes and c = sum(P) / sum(N), the largest of |sum(P^k) / (c^k sum(N^k)) - 1|
    over k = 2, 3, 4. Zero (to float rounding, ~1e-7) when P is c times N as a multiset;
    about 1 / sqrt(features) for an honest row. Power sums need no sort (a sort of 150k
    weights per row takes 50 ms)."""
    positive = rows.clamp_min(0)
    negative = (-rows).clamp_min(0)
    factor = positive.sum(1, dtype=torch.float64) / negative.sum(1, dtype=torch.float64)
    error = torch.zeros(len(rows), dtype=torch.float64, device=rows.device)
    for k in (2, 3, 4):
        p = positive.pow(k).sum(1, dtype=torch.float64)
        n = negative.pow(k).sum(1, dtype=torch.float64) * factor**k
        error = torch.maximum(error, (p / n - 1).abs())
    return torch.nan_to_num(error, nan=math.inf)


def transmit_ratios(kernels: torch.Tensor) -> torch.Tensor:
    """SEER's transmit ratio of each kernel: the largest |weight| over the sum of the other
    |weights| (inf for a single non-zero tap, nan for a zero kernel)."""
    magnitudes = kernels.detach().double().flatten(1).abs()
    largest = magnitudes.amax(1)
    rest = magnitudes.sum(1) - largest
    ratio = largest / rest
    return torch.where(largest > 0, ratio, torch.full_like(ratio, math.nan))


def transmits(layer: str, kernels: torch.Tensor):
    """A convolution that passes its input through: every non-zero kernel is (nearly) one
    tap (LOKI's client kernels copy each pixel into a channel of one block, the other
    blocks' kernels zero)."""
    if kernels[0].numel() < MIN_TAPS:
        return None
    ratio = transmit_ratios(kernels)
    live = ~ratio.isnan()
    if not bool(live.any()) or not bool((ratio[live] > TRANSMIT_RATIO).all()):
        return None
    zero = int((~live).sum())
    rest = f"; {zero} of its {len(ratio)} kernels are zero" if zero else ""
    return Finding(
        "transmit",
        layer,
        f"layer {layer}: every non-zero kernel ({int(live.sum())}) passes one input through "
        f"unchanged (transmit ratio > {TRANSMIT_RATIO:g}){rest}",
        float(ratio[live].min()),
    )


def identical_columns(layer: str, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """A linear layer whose columns are all the same: its output depends on its input only
    through the input's sum (Robbing the Fed's and LOKI's layer back to the model's input),
    so the model no longer sees its own input."""
    if weight.shape[1] < 2 or weight.shape[0] < 2:
        return None
    low, high = torch.aminmax(weight, dim=1)  # identical columns: every row is constant
    largest = max(float(high.max()), -float(low.min()))
    if largest == 0:
        return None
    spread = float((high - low).max()) / largest
    if spread > IDENTICAL:
        return None
    return Finding(
        "transmit",
        layer,
        f"layer {layer}: all {weight.shape[1]} columns are identical (it hands every output "
        "one number, the sum of its inputs)",
        spread,
    )


class _StopForward(Exception):
    pass


_RELUS = {torch.relu, F.relu, torch.Tensor.relu}


class _ReluAfterLinear(TorchFunctionMode):
    """Records which linear outputs go straight into a ReLU (as a module or a function),
    and stops the forward pass once the last of ``wanted`` has gone through its ReLU."""

    def __init__(
        self, outputs: dict[int, tuple[str, torch.Tensor]], wanted: set[str] | None
    ) -> None:
        super().__init__()
        self.outputs = outputs
        self.wanted = wanted
        self.activations: dict[str, torch.Tensor] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func in _RELUS and args and id(args[0]) in self.outputs:
            name = self.outputs[id(args[0])][0]
            self.activations[name] = result.detach()
            if self.wanted is not None and self.wanted <= set(self.activations):
                raise _StopForward
        return result


def relu_activations(
    model: nn.Module, images: torch.Tensor, wanted: set[str] | None = None
) -> dict[str, torch.Tensor]:
    """The activations (batch x units) of every ``nn.Linear`` whose output goes straight into
    a ReLU, on ``images``, in eval mode and without gradients; the model's modes are left as
    found. With ``wanted`` the forward pass stops once those layers are seen."""
    outputs: dict[int, tuple[str, torch.Tensor]] = {}
    linears = {m: n for n, m in model.named_modules() if isinstance(m, nn.Linear)}

    def keep(module, inputs, output):
        outputs[id(output)] = (linears[module], output)  # held: no id is reused meanwhile

    modes = {m: m.training for m in model.modules()}
    hooks = [m.register_forward_hook(keep) for m in linears]
    mode = _ReluAfterLinear(outputs, wanted)
    try:
        model.eval()
        with torch.no_grad(), mode:
            model(images)
    except _StopForward:
        pass
    finally:
        for hook in hooks:
            hook.remove()
        for m, training in modes.items():
            m.training = training
    return mode.activations


def dominance(layer: str, activations: torch.Tensor):
    """One sample dominating a ReLU layer: of the units that fire on the batch, the share
    fired by one image alone (such a unit's weight update is that image), flagged only when
    it is extreme and most units are silent (trap rows fire rarely, honest units for about
    half the images)."""
    samples, units = activations.shape
    if samples < 2 or units < MIN_UNITS:
        return None
    fired = (activations > 0).sum(0)
    active = int((fired > 0).sum())
    silent = 1 - active / units
    single = int((fired == 1).sum()) / active if active else 0.0
    if single < EXTREME or silent < SILENT:
        return None
    return Finding(
        "dominance",
        layer,
        f"layer {layer}: on this batch {single:.0%} of the units that fire do so for one "
        f"image alone and {silent:.0%} of its {units} units stay silent (one image "
        "dominates each unit's update)",
        single,
    )


def weight_findings(model: nn.Module) -> tuple[list[Finding], int]:
    """The weight signatures (imprint, trap, transmit) of every layer; and how many layers
    were looked at."""
    findings: list[Finding] = []
    linears = linear_layers(model)
    kernels = kernel_layers(model)
    for layer, weight, bias in linears:
        for check in (shared_directions, trap_weights, identical_columns):
            finding = check(layer, weight, bias)
            if finding is not None:
                findings.append(finding)
    for layer, weight in kernels:
        finding = transmits(layer, weight)
        if finding is not None:
            findings.append(finding)
    return findings, len(linears) + len(kernels)


def batch_findings(model: nn.Module, images: torch.Tensor) -> tuple[list[Finding], int]:
    """The data-driven check on the client's own batch: each linear layer followed by a ReLU.

    A first pass on one image finds those layers (none in most models: then nothing more is
    run); the batch then runs only as far as the last of them."""
    if images.shape[0] < 2 or not any(isinstance(m, nn.Linear) for m in model.modules()):
        return [], 0
    found = set(relu_activations(model, images[:1]))
    if not found:
        return [], 0
    activations = relu_activations(model, images, found)
    findings = [dominance(n, a.flatten(1)) for n, a in activations.items()]
    return [f for f in findings if f is not None], len(activations)


def summary(findings: Sequence[Finding]) -> str:
    return "model check: " + "; ".join(f.text for f in findings)

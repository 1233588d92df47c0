"""Where a binning server puts its thresholds: quantiles of a brightness prior it can hold.

Robbing the Fed and LOKI sort inputs into bins by one linear measure, the image's mean pixel
in [0, 1] (its brightness). A bin separates an image when no other image of the batch falls
in it, so the thresholds sit at equal-mass quantiles of the measure's distribution over
images. The server cannot see the client's images: it fits that distribution on public data
it holds (a Normal of the per-image brightness of a public sample set), and a threshold comes
from that fit, never from the audited batch.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass

import numpy as np

from auditlib.data.decode import DEFAULT_LIMITS
from auditlib.data.model_input import content_hashes
from auditlib.data.samples import SAMPLE_SETS, load_sample_set
from auditlib.errors import AuditInputError

# The public sets a server may fit its prior on, with how many images it reads of each.
PUBLIC_PRIORS = {"faces": 200, "fashion-mnist": 1000, "digits": 1000, "photographs": 17}


@dataclass(frozen=True)
class AuditedPixels:
    """The audited images' content at the audit's input size (``data.content_hashes``), so
    a public set holding any of them is refused as the server's prior whatever the audited
    images came in (a sample set by name, or the same photographs as a folder or upload)."""

    height: int
    width: int
    hashes: frozenset[str]


@dataclass(frozen=True)
class MeasurePrior:
    """The server's belief about the brightness of the images it will see: a Normal."""

    mean: float
    std: float
    source: str  # in words: the public data it was fitted on

    def __post_init__(self) -> None:
        if not (0.0 <= self.mean <= 1.0) or not (self.std > 0):
            raise AuditInputError(
                f"a brightness prior needs a mean in [0, 1] and a std > 0, got "
                f"{self.mean}, {self.std}"
            )

    def thresholds(self, bins: int, *, lowest: float | None = None) -> tuple[float, ...]:
        """``bins`` ascending thresholds at the prior's quantiles k / bins, k = 0..bins-1.

        The first is ``lowest`` (default: below any brightness, so every image passes it):
        then bin k holds the images between threshold k and k + 1, the last everything above.
        """
        if bins < 1:
            raise AuditInputError(f"a binning layer needs at least 1 bin, got {bins}")
        normal = statistics.NormalDist(self.mean, self.std)
        inner = [normal.inv_cdf(k / bins) for k in range(1, bins)]
        first = -1.0 if lowest is None else lowest
        return (first, *inner)


def public_prior(
    source: str, audited: str | None = None, pixels: AuditedPixels | None = None
) -> MeasurePrior:
    """The Normal fitted on the per-image brightness of public sample set ``source``.

    ``audited`` names the sample set the audited images come from (None: the auditor's own
    folder or upload); ``pixels`` holds their content hashes. A prior fitted on the very
    images under attack is refused: the audited set by name, and any set whose images the
    prior reads meet the audited images' hashes.
    """
    if source not in PUBLIC_PRIORS:
        raise AuditInputError(
            f"unknown public data {source!r} for the bins' prior; expected one of "
            f"{', '.join(PUBLIC_PRIORS)}"
        )
    others = ", ".join(s for s in PUBLIC_PRIORS if s != source)
    if audited is not None and audited == source:
        raise AuditInputError(
            f"the bins' prior must come from public data the server holds, not from the "
            f"client's images: the audited images are sample set {source!r}; choose another "
            f"public set ({others})"
        )
    if pixels is not None:
        shared = len(pixels.hashes & _public_hashes(source, pixels.height, pixels.width))
        if shared:
            raise AuditInputError(
                f"the bins' prior must come from public data the server holds, not from the "
                f"client's images: {shared} of the audited images are images of sample set "
                f"{source!r} (the same pixels at {pixels.height} x {pixels.width}, whatever "
                f"files they came in), so a prior fitted on that set would have seen them; "
                f"expected a public set that holds none of the audited images: choose "
                f"another ({others})"
            )
    mean, std = _brightness(source)
    return MeasurePrior(mean, std, f"{PUBLIC_PRIORS[source]} images of {SAMPLE_SETS[source].name}")


@functools.cache
def _public_hashes(source: str, height: int, width: int) -> frozenset[str]:
    """The content hashes of the images the prior reads of ``source`` (its first
    ``PUBLIC_PRIORS[source]`` images, as ``_brightness`` reads them) at ``height`` x
    ``width``."""
    hashes: set[str] = set()
    for offset in range(0, PUBLIC_PRIORS[source], CHUNK):
        count = min(CHUNK, PUBLIC_PRIORS[source] - offset)
        images = load_sample_set(source, count, seed=0, offset=offset).images
        hashes.update(content_hashes(images, height, width, cached=False))
    return frozenset(hashes)


CHUNK = DEFAULT_LIMITS.max_images


def public_images(
    source: str,
    shape: tuple[int, int, int],
    audited: str | None = None,
    audited_pixels: AuditedPixels | None = None,
):
    """The public set's images as pixels in [0, 1] at ``shape`` (C x H x W): resized
    bilinearly, a grey set repeated over the channels. Refused where it is the audited set
    or holds any audited image (``public_prior``'s refusals)."""
    import torch
    import torch.nn.functional as F

    public_prior(source, audited, audited_pixels)  # the same refusals as the prior's
    channels, height, width = shape
    out = []
    for offset in range(0, PUBLIC_PRIORS[source], CHUNK):
        count = min(CHUNK, PUBLIC_PRIORS[source] - offset)
        for image in load_sample_set(source, count, seed=0, offset=offset).images:
            pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0)
            pixels = pixels.permute(2, 0, 1)[None]
            pixels = F.interpolate(
                pixels, size=(height, width), mode="bilinear", align_corners=False
            )
            grey = pixels.mean(dim=1, keepdim=True)
            out.append(
                grey.expand(1, channels, height, width) if pixels.shape[1] != channels else pixels
            )
    return torch.cat(out).clamp(0, 1)


@functools.cache
def _brightness(source: str) -> tuple[float, float]:
    values = []
    for offset in range(0, PUBLIC_PRIORS[source], CHUNK):  # the loader hands out 64 at a time
        count = min(CHUNK, PUBLIC_PRIORS[source] - offset)
        chunk = load_sample_set(source, count, seed=0, offset=offset)
        values += [float(np.asarray(i, dtype=np.float64).mean() / 255.0) for i in chunk.images]
    values = np.array(values)
    return float(values.mean()), float(max(values.std(ddof=1), 1e-3))

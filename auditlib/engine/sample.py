"""An audit of the sample: every batch of the auditor's set is one client's update.

``update_specs`` cuts the set into updates of ``batch_size`` images, in order from the
spec's offset (update u holds images offset + u*B .. offset + (u+1)*B - 1); each update is
then audited as one run is (its control first where it has a defense) and judged on its
own, and ``metrics.sample.SampleVerdict`` counts what they found: the share of images
recovered with its 95 % interval, per update its figures, the worst case, and the labels
recovered over all the updates (k of N x B, the same interval, one test).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from auditlib.data import load_image_folder, load_zip, sample_set_size
from auditlib.errors import AuditInputError
from auditlib.spec import DataSpec, RunSpec

MAX_UPDATES = 256  # updates in one sample audit (each is a full audit)
ALL = "all"


def images_available(data: DataSpec, assets: Mapping[str, bytes] | None = None) -> int:
    """How many images the spec's source holds."""
    if data.source == "samples":
        return sample_set_size(data.location)
    if data.source == "folder":
        return len(load_image_folder(data.location, labels_csv=data.labels_csv))
    if data.source == "asset":
        if assets is None or data.location not in assets:
            raise AuditInputError(f"the images {data.location[:12]}... were not handed over")
        return len(load_zip(assets[data.location]))
    raise AuditInputError("a sample audit needs the client's images; this run has none")


def update_specs(
    spec: RunSpec, updates: int | str, assets: Mapping[str, bytes] | None = None
) -> list[RunSpec]:
    """The sample's updates as run specs: ``updates`` of them (or ``"all"`` the set holds)
    of the spec's batch size each, from its offset on; refused in one line where the set
    does not hold them."""
    if spec.scenario.observed is not None:
        raise AuditInputError(
            "an observed update is one update a client sent; a sample audit simulates many "
            "(leave out --updates)"
        )
    data = spec.data
    available = images_available(data, assets) - data.offset
    size = data.batch_size or max(available, 1)
    most = max(available, 0) // size
    if updates == ALL:
        count = most
    elif isinstance(updates, int) and updates >= 1:
        count = updates
    else:
        raise AuditInputError(f"updates must be a whole number >= 1 or 'all', got {updates!r}")
    if count > MAX_UPDATES:
        raise AuditInputError(
            f"{count} updates asked for; a sample audit runs at most {MAX_UPDATES} (each is a "
            "full audit): give --updates N"
        )
    if count < 1 or count > most:
        raise AuditInputError(
            f"the set holds {max(available, 0)} images from offset {data.offset}: "
            f"{most} update{'s' if most != 1 else ''} of {size}; "
            f"{count} of {size} need {count * size}"
        )
    return [
        replace(spec, data=replace(data, offset=data.offset + u * size, content_sha256=None))
        for u in range(count)
    ]

"""Checks a run passes before anything is recorded or started, wherever it comes from (the
CLI, the dashboard's worker): what would otherwise fail in the middle of the run in
torch's words."""

from __future__ import annotations


def smallest_forward_batch(spec) -> int | None:
    """The fewest images one forward of the client's update takes: the smallest client's
    share under secure aggregation (``engine.releases.client_batches`` splits in order, as
    evenly as they go), then its smallest local mini-batch. None while the batch size is
    unknown (a folder's images, counted when they are read)."""
    batch = spec.data.batch_size
    if batch is None:
        return None
    share = batch // spec.scenario.clients
    slices = spec.scenario.protocol.minibatch_slices(share)
    return min(len(range(*s.indices(share))) for s in slices)


def check_model_trains(spec) -> None:
    """Refuse, before any run, a model whose training-mode BatchNorm cannot take the
    client's batch (one image whose feature map shrinks to 1x1): torch would fail in the
    middle of the run with its own words. Built only where that can happen."""
    from auditlib.models import build_model
    from auditlib.models.registry import MAX_SIDE
    from auditlib.models.shapes import check_training_batch

    model_spec = spec.model.spec
    if spec.model.trusted_archive is not None or not model_spec.info.has_batchnorm:
        return
    if spec.scenario.protocol.batchnorm_mode != "train" or smallest_forward_batch(spec) != 1:
        return
    model = build_model(model_spec)
    check_training_batch(model, model_spec.input_shape, 1, MAX_SIDE)

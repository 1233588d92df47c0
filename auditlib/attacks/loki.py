"""LOKI (Zhao, Sharma, Elkordy, Ezzeldin, Avestimehr, Bagchi, IEEE S&P 2024): each client
gets convolution kernels of its own that route its pixels into a channel block no other
client writes, then brightness bins per block; in the secure-aggregation sum each block's
rows are one client's update, read back as ``rtf`` reads its bins (``attacks.imprint``),
and each image is attributed to its client."""

from __future__ import annotations

from dataclasses import dataclass

from auditlib.attacks.base import Clock, RunControl, register
from auditlib.attacks.imprint import (
    ReadBack,
    block_update,
    noise_floor,
    read_bins,
    server_attack,
    single_event,
)
from auditlib.attacks.rtf import Prior, stack_pixels
from auditlib.config import check_ranges, param
from auditlib.server.bins import public_prior
from auditlib.server.build import build_loki
from auditlib.server.modification import (
    BuildContext,
    ServerModification,
    pixels,
    rows_within_budget,
)
from auditlib.threat import AttackerKnowledge, Observation


@dataclass(frozen=True)
class LokiConfig:
    bins: int = param(
        0,
        "brightness rows per client; 0: bins_per_image times the client's batch",
        low=0,
        high=4096,
    )
    bins_per_image: int = param(
        8, "rows per image of a client's batch when bins is 0", low=1, high=64
    )
    prior: Prior = param(
        "faces",
        "public data the server fits its brightness prior on (never the audited images)",
    )

    def __post_init__(self) -> None:
        check_ranges(self)

    def bins_for(self, images: int, pixels: int, clients: int) -> int:
        """Rows per client asked for; 0: bins_per_image per image of a client's batch, as
        many as the largest block built here holds (each row reads every client's block)."""
        if self.bins:
            return self.bins
        wanted = self.bins_per_image * images * clients
        return max(1, rows_within_budget(wanted, pixels * clients, pixels) // clients)


def build(config: LokiConfig, context: BuildContext) -> ServerModification:
    prior = public_prior(config.prior, context.audited_source, context.audited_pixels)
    size = pixels(context.input_shape)
    per_client = config.bins_for(context.batch_size, size, context.clients)
    return build_loki(context, per_client, prior, config.prior)


def run_loki(
    observation: Observation,
    knowledge: AttackerKnowledge,
    config: LokiConfig,
    control: RunControl,
    seed: int,
):
    clock = Clock(control)
    server = knowledge.server
    update = block_update(observation, knowledge)
    size = pixels(knowledge.input_shape)
    rows, clients, support = [], [], []
    by_bias = observation.kind == "gradient"
    floor = noise_floor(observation, knowledge)
    for client in range(server.clients):
        first = client * server.rows
        for strength, flat in read_bins(update, first, server.thresholds, by_bias, floor):
            rows.append(flat[client * size : (client + 1) * size])
            clients.append(client)
            support.append(strength)
    read = ReadBack(
        pixels=stack_pixels(rows, (-1, *knowledge.input_shape), update.bias),
        clients=tuple(clients),
        support=tuple(support),
    )
    inference = {"rule": "LOKI: each client's block of bins, read back as Robbing the Fed's"}
    return single_event(read, knowledge, clock, inference)


register(
    server_attack(
        "loki",
        "LOKI (Zhao et al. 2024): per-client kernels and brightness bins; images of "
        "many clients read back from the secure-aggregation sum and attributed.",
        LokiConfig,
        run_loki,
        build,
        paper={"bins": 0, "bins_per_image": 4, "prior": "faces"},
        audit={"bins": 0, "bins_per_image": 8, "prior": "faces"},
        why="a closed form, so the budget buys bins: 8 per image of a client's batch",
    )
)

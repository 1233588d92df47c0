"""What the PDF report states, as plain values and text: pure functions over the subject's
entries (typed results and specs, ``subject.ReportEntry``) and rows (``subject.RunRow``).

Nothing here imports reportlab or writes markup: ``sections_front`` escapes these texts
and lays them out (``facts_results`` and ``facts_back`` hold the facts of the later
sections). Where a run stored by an earlier version lacks a part, the text says
"not recorded" (``text.NOT_RECORDED``) rather than guessing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from auditlib.attacks import ATTACKS
from auditlib.metrics.catalogue import MEANINGFUL_EPSILON, epsilon_note
from auditlib.report import facts_server
from auditlib.report.subject import ReportEntry, ReportSubject, RunRow, learns_nothing
from auditlib.report.text import (
    NOT_AVAILABLE,
    NOT_RECORDED,
    clip,
    knowledge_text,
    metric_text,
    number_text,
    settings_text,
)
from auditlib.store.convert import finite_number
from auditlib.words import count_of

SHOWN_NAMES = 24  # image names listed in the scenario; the rest counted


# ------------------------------------------------------------------------------ the subject


def with_runs(entries: Sequence[ReportEntry]) -> list[ReportEntry]:
    return [e for e in entries if e.run is not None]


def completed(entries: Sequence[ReportEntry]) -> list[ReportEntry]:
    """Completed or timed out with scores: the runs whose numbers count."""
    return [e for e in entries if e.has_result]


def reference(entries: Sequence[ReportEntry]) -> ReportEntry | None:
    """The run whose model, data and scenario the report describes: the first with a
    result, else the first run at all."""
    ran = with_runs(entries)
    return (completed(entries) or [e for e in ran if e.result] or ran or [None])[0]


def attack_names(entries: Sequence[ReportEntry]) -> list[str]:
    names = []
    for entry in with_runs(entries):
        if entry.spec is not None:
            names.append(entry.spec.attack.name)
        elif entry.result is not None:
            names.append(entry.result.attack)
    return list(dict.fromkeys(names))


def batch_size(entry: ReportEntry | None) -> int | None:
    if entry is not None and entry.result is not None:
        return len(entry.result.victim.data.names)
    if entry is not None and entry.spec is not None:
        return entry.spec.data.batch_size
    return None


def images_count(entry: ReportEntry | None, noun: str = "image") -> str:
    size = batch_size(entry)
    return f"{noun}s (how many: {NOT_RECORDED})" if size is None else count_of(size, noun)


def data_source(entry: ReportEntry | None) -> str:
    if entry is not None and entry.result is not None and entry.result.victim.data.source:
        return entry.result.victim.data.source
    if entry is not None and entry.spec is not None:
        return f"{entry.spec.data.source} {entry.spec.data.location}".strip()
    return NOT_RECORDED


def model_text(entry: ReportEntry | None) -> str:
    """'lenet, input 1 x 16 x 16, 10 classes, 9,466 parameters, uniform initialisation (seed 0)'."""
    parameters = None
    if entry is not None and entry.result is not None:
        parameters = entry.result.victim.num_parameters
    counted = f", {parameters:,} parameters" if parameters else ""
    if entry is None or entry.spec is None:
        return f"model {NOT_RECORDED}{counted}"
    ref = entry.spec.model
    model = ref.spec
    shape = " x ".join(str(s) for s in model.input_shape) or "?"
    text = f"{model.architecture}, input {shape}, {model.num_classes} classes{counted}"
    if ref.weights or ref.weights_asset:
        return text + ", uploaded weights"
    if ref.trusted_archive:
        return text + ", trusted archive"
    return text + f", {model.init} initialisation (seed {model.seed})"


def subject_text(subject: ReportSubject) -> str:
    count = len(subject.entries)
    if subject.kind == "run":
        return "one audit run"
    if subject.kind == "comparison":
        return f"a comparison of {count} defenses under one attack"
    if subject.kind == "sample":
        return f"an audit of the sample: {count} updates, each one client's batch"
    knobs = dict.fromkeys(f"{e.series} {e.knob}" for e in subject.entries if e.knob is not None)
    return f"a sweep of {count} runs over {', '.join(knobs) or 'defense settings'}"


def runs_text(entries: Sequence[ReportEntry]) -> str:
    done = completed(entries)
    timed_out = sum(1 for e in done if e.run is not None and e.run.status == "timed_out")
    text = f"{len(done)} with results of {len(entries)}"
    return text + (f" ({timed_out} of them timed out)" if timed_out else "")


def audited_versions(entries: Sequence[ReportEntry]) -> str:
    """'auditlib 0.1.0': the versions that measured the runs with results."""
    versions = sorted(
        {e.result.versions.get("auditlib", NOT_RECORDED) for e in completed(entries) if e.result}
    )
    return ", ".join(f"auditlib {v}" for v in versions) or NOT_AVAILABLE


# ------------------------------------------------------------------------------ utility words


def beside_accuracy(row: RunRow) -> str:
    """Chance level and the undefended accuracy, the figures an accuracy is read against."""
    parts = []
    if finite_number(row.utility_chance) is not None:
        parts.append(f"chance {metric_text('accuracy', row.utility_chance)}")
    if row.series != "none" and finite_number(row.utility_undefended) is not None:
        parts.append(f"undefended {metric_text('accuracy', row.utility_undefended)}")
    return ", ".join(parts)


def utility_words(row: RunRow) -> str:
    """' Model accuracy after federated training x% (chance y%, undefended z%).' or '', and
    where the defended model learns nothing, that the setting is no usable defense."""
    if finite_number(row.utility_accuracy) is None:
        return ""
    beside = beside_accuracy(row)
    text = (
        f" Model accuracy after federated training {metric_text('accuracy', row.utility_accuracy)}"
    )
    text += f" ({beside})" if beside else ""
    if finite_number(row.epsilon) is not None:
        text += f", ε = {metric_text('epsilon', row.epsilon)}"
        if epsilon_note([row.epsilon]):
            text += f" (above {MEANINGFUL_EPSILON:g}: no meaningful formal guarantee)"
    unusable = learns_nothing(row)
    return text + "." + (f" {unusable[0].upper()}{unusable[1:]}." if unusable else "")


# ------------------------------------------------------------------------------ threat, scenario


@dataclass(frozen=True)
class ServerKnows:
    """What the server knew, as runs recorded before verdicts (and their cards) list it."""

    observation: str
    common: tuple[str, ...]  # known in every run
    extras: tuple[tuple[str, tuple[str, ...]], ...]  # (run label, what it knew beyond)


def observation(entry: ReportEntry | None) -> str:
    if entry is None or entry.result is None:
        return "update"
    return entry.result.threat_model.observation


def server_knows(entries: Sequence[ReportEntry]) -> ServerKnows:
    known = [
        (e.label, [knowledge_text(str(k)) for k in e.result.threat_model.server_knows])
        for e in with_runs(entries)
        if e.result is not None
    ]
    lists = [k for _, k in known if k]
    common = [k for k in lists[0] if all(k in other for other in lists)] if lists else []
    extras = []
    for label, items in known:
        more = tuple(k for k in items if k not in common)
        if more:
            extras.append((label, more))
    return ServerKnows(observation(reference(entries)), tuple(common), tuple(extras))


def scenario_pairs(entry: ReportEntry | None) -> list[tuple[str, str]]:
    """The FL scenario of the reference run, as (key, text) rows."""
    spec = None if entry is None else entry.spec
    if spec is not None:
        protocol = spec.scenario.protocol
        steps = (
            f"{protocol.local_epochs} local epoch(s)"
            if protocol.local_epochs
            else f"{protocol.local_steps} local step(s)"
        )
        pairs = [
            ("FL algorithm", protocol.algorithm),
            (
                "Client training",
                f"{steps} at learning rate {protocol.local_lr}, local batch "
                f"{protocol.local_batch_size or 'the whole batch'}",
            ),
            ("Client sends", protocol.shared),
        ]
    else:
        pairs = [(k, NOT_RECORDED) for k in ("FL algorithm", "Client training", "Client sends")]
    clients = facts_server.clients_of(entry)
    observed = (
        f"the client's {observation(entry)} for one round, as the defense left it"
        if clients is None
        else f"the example-weighted sum of {clients} clients' {observation(entry)}s for one "
        "round, each as the defense left it"
    )
    pairs.append(("Server", facts_server.server_words(entry)))
    pairs.append(("Server observes", observed))
    pairs.append(("Secure aggregation", facts_server.aggregation_words(entry)))
    if spec is not None:
        scenario, model = spec.scenario, spec.model
        pairs.append(("BatchNorm mode", scenario.protocol.batchnorm_mode))
        pairs.append(("Labels known to server", "yes" if scenario.labels_known else "no"))
        if scenario.observed is not None:
            trained = "the observed update's global weights (the model its round started from)"
        elif scenario.pretrain_rounds:
            trained = (
                f"trained for {scenario.pretrain_rounds} FedAvg rounds on "
                f"{scenario.pretrain_data} before the attack"
            )
        elif model.weights or model.weights_asset or model.trusted_archive:
            trained = "as uploaded, not trained further before the attack"
        else:
            trained = "freshly initialised (the attack happens in round 1)"
        pairs.append(("Global model", trained))
    else:
        pairs += [
            (k, NOT_RECORDED) for k in ("BatchNorm mode", "Labels known to server", "Global model")
        ]
    pairs.append(("Model", model_text(entry)))
    data = None if entry is None or entry.result is None else entry.result.victim.data
    names = [] if data is None else list(data.names)
    shown = ", ".join(clip(n, 40) for n in names[:SHOWN_NAMES])
    if len(names) > SHOWN_NAMES:
        shown += f" … and {len(names) - SHOWN_NAMES} more"
    size = batch_size(entry)
    if not names and spec is not None and spec.scenario.observed is not None:
        size = None  # no images given; the client's example count is its training record's
    pairs += [
        ("Private data", data_source(entry)),
        ("Batch size", NOT_AVAILABLE if size is None else str(size)),
        ("Images", shown or NOT_AVAILABLE),
        ("Labels", (data.label_source if data else None) or NOT_AVAILABLE),
        ("Normalisation", spec.data.normalization if spec is not None else NOT_RECORDED),
    ]
    return pairs


# ------------------------------------------------------------------------------ settings


@dataclass(frozen=True)
class AttackSettings:
    """One attack as the runs configured it (runs that share attack, budget and seed once)."""

    name: str
    summary: str | None  # the registry's one line on it
    preset: str
    settings: str  # "key: value" items, one line per attack where several ran
    budget: str
    seed_device: str
    lpips_nets: str


def attack_settings(entries: Sequence[ReportEntry]) -> list[AttackSettings]:
    out: list[AttackSettings] = []
    seen: set[object] = set()
    for entry in with_runs(entries):
        spec, result = entry.spec, entry.result
        key = (spec.attack, spec.budget, spec.seed) if spec else (result and result.attack)
        if key in seen:
            continue
        seen.add(key)
        name = spec.attack.name if spec else result.attack if result else NOT_RECORDED
        info = ATTACKS.get(name)
        if result is not None and result.config.attack_settings:
            settings = settings_text(dict(result.config.attack_settings))
        else:
            settings = settings_text(spec.attack.params_dict() if spec else {})
        budget = NOT_RECORDED
        if spec is not None:
            budget = f"{spec.budget.iterations} optimiser steps per restart"
            if info and info.paper_iterations:
                budget += f" (the paper: {info.paper_iterations})"
            if spec.budget.max_seconds:
                budget += f", at most {spec.budget.max_seconds:g} s"
        nets = result.config.lpips_nets if result is not None else ()
        out.append(
            AttackSettings(
                name=name,
                summary=info.summary if info else None,
                preset=(spec.attack.preset or "none") if spec else NOT_RECORDED,
                settings=settings,
                budget=budget,
                seed_device=f"{spec.seed}, {spec.device}" if spec else NOT_RECORDED,
                lpips_nets=", ".join(nets) if nets else "none",
            )
        )
    return out


@dataclass(frozen=True)
class DefenseRow:
    label: str
    defense: str
    settings: str | None  # None: the member has not been run
    epsilon: str  # with its δ where the defense states one
    update_norm: str  # "before → after"


def defense_rows(entries: Sequence[ReportEntry], rows: Sequence[RunRow]) -> list[DefenseRow]:
    out = []
    for entry, row in zip(entries, rows, strict=True):
        result, spec = entry.result, entry.spec
        report = None if result is None else result.defense_report
        if result is not None and result.config.defense_settings:
            settings: dict = dict(result.config.defense_settings)
        else:
            settings = spec.defense.params_dict() if spec is not None else {}
        epsilon = metric_text("epsilon", row.epsilon)
        delta = None if report is None else finite_number(report.delta)
        if delta is not None and epsilon != NOT_AVAILABLE:
            epsilon += f" (δ = {delta:g})"
        before = None if report is None else report.update_norm_before
        after = None if report is None else report.update_norm_after
        out.append(
            DefenseRow(
                entry.label,
                row.series,
                settings_text(settings) if entry.run is not None else None,
                epsilon,
                f"{number_text(before)} → {number_text(after)}",
            )
        )
    return out


def utility_settings(entries: Sequence[ReportEntry]) -> list[tuple[str, str]]:
    """How utility was measured (empty where no run asked for it); "Training starts from"
    only where a run recorded it."""
    specs = [e.spec.utility for e in with_runs(entries) if e.spec and e.spec.utility]
    if not specs:
        return []
    utility, federation = specs[0], specs[0].federation
    starts = next(
        (
            e.result.measured_utility.starts_from
            for e in with_runs(entries)
            if e.result is not None
            and e.result.measured_utility is not None
            and e.result.measured_utility.starts_from not in ("", NOT_RECORDED)
        ),
        None,
    )
    pairs = [
        ("Dataset", utility.dataset),
        ("Examples", f"{utility.train} training, {utility.test} held out"),
        (
            "Federation",
            f"{federation.clients} clients ({federation.split}), {federation.rounds} rounds of "
            f"{federation.local_epochs} local epoch(s) at learning rate {federation.local_lr}, "
            f"seed {federation.seed}",
        ),
    ]
    if starts:
        pairs.append(("Training starts from", starts))
    pairs.append(("Defense", "the run's defense, applied to every client's update"))
    return pairs

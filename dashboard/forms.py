"""The sidebar forms of the Attack lab, Compare and Trade-off pages (not a page).

The three pages share one set of widget keys (see ``dashboard.state.persist``), so a scenario
and attack chosen in the lab are already chosen when the auditor turns to Compare or
Trade-off. The choices come from the library's definitions: the client protocol's
``Literal`` types, the attack and defense registries (with each attack's iteration counts),
``UTILITY_DATASETS``.
"""

from __future__ import annotations

import dataclasses
from typing import get_args

import streamlit as st

from auditlib.attacks import ALL_ATTACKS, ALL_ATTACKS_LABEL, ATTACKS, default_iterations
from auditlib.client.protocol import Algorithm, ClientProtocol, Shared
from auditlib.defenses import DEFENSES
from auditlib.engine.attack_phase import plan_attacks
from auditlib.errors import AuditInputError
from auditlib.spec import MAX_CLIENTS, SERVERS, UTILITY_DATASETS, ComponentSpec, UtilitySpec
from auditlib.words import count_of
from dashboard.auth import signed_in_only
from dashboard.config_form import changed_params, config_defaults, config_inputs
from dashboard.navigation import SETUP
from dashboard.plain import literal
from dashboard.resources import EMIT_EVERY, shared_manager
from dashboard.run_choices import LabChoices, batch_size, check_clients_fit, check_components
from dashboard.setup_state import Setup, current_setup, setup_problems
from dashboard.spec_words import (
    ALGORITHM_WORDS,
    SERVER_WORDS,
    SHARED_WORDS,
    attack_label,
    preset_label,
    protocol_words,
    threat_words,
)
from dashboard.state import persist

DEVICES = ["cpu", "cuda"]  # RunSpec.device is a string: the library lists no choices
# Compare and Trade-off run two attacks at a time on a 2-core machine, each slower than a lone
# run. Measured on this 2-core machine (busy with other work): the default comparison (DLG's
# audit preset, 300 steps per start = 480 raced steps, LeNet, one photograph; none,
# dp-gaussian, prune, soteria) took 122, 136, 183 and 221 s of attack, two at a time; the old
# 120 s budget cut them all short. 600 s leaves more than twice the slowest.
BATCH_TIME_BUDGET_S = 600
LAB_TIME_BUDGET_S = 120
DEFAULT_CLIENTS = 4  # secure aggregation's first value: a batch of 8 samples, 2 per client
# The threat models in plain words (the radio's help and the caption under a malicious one).
SERVER_HELP = (
    "Honest-but-curious: the server sends the global model as it is and attacks the update "
    "it gets back (dlg, ig, ...). Malicious: the server changes the model it sends so that "
    "the update holds the client's images, and reads them back in one pass: rtf puts an "
    "imprint block of brightness bins in front of the model, cah trap weights that one image "
    "alone fires, loki per-client kernels that keep the clients apart even under secure "
    "aggregation."
)
MALICIOUS_CAPTION = (
    "The server changes the model it sends; the run's threat card says what it changed and "
    "whether the client could have noticed. The defense to try: the client's model check "
    "(model-check), which inspects the model before training and refuses one built to leak."
)
AGGREGATION_HELP = (
    "The server sees only the example-weighted sum of several clients' updates, never one "
    "client's. The private images are split over the clients in order; an honest server's "
    "attacks face the sum, loki (malicious server) separates the clients and attributes the "
    "images it recovers."
)

# --- the form (sidebar) ---------------------------------------------------------------------


def threat_inputs(lab: LabChoices, batch: int | None = None) -> None:
    """The threat model (honest or malicious server) and secure aggregation; ``batch``: the
    images the run audits, where known, to say how they are split over the clients."""
    lab.server = st.radio(
        "Threat model",
        SERVERS,
        format_func=lambda s: SERVER_WORDS.get(s, s),
        persist_state="session",
        key=persist("server", "honest"),
        help=SERVER_HELP,
    )
    if lab.server == "malicious":
        st.caption(MALICIOUS_CAPTION)
    aggregate = st.checkbox(
        "Secure aggregation",
        persist_state="session",
        key=persist("secure_aggregation.on", False),
        help=AGGREGATION_HELP,
    )
    lab.secure_aggregation = None
    if not aggregate:
        return
    lab.secure_aggregation = int(
        st.number_input(
            "Clients in the sum",
            2,
            MAX_CLIENTS,
            step=1,
            persist_state="session",
            key=persist("secure_aggregation.clients", DEFAULT_CLIENTS),
            help=f"2 to {MAX_CLIENTS} clients, each holding at least one of the private images.",
        )
    )
    if batch is not None and lab.secure_aggregation <= batch:
        st.caption(split_words(batch, lab.secure_aggregation))


def split_words(batch: int, clients: int) -> str:
    """'The 8 private images are split over 4 clients in order, 2 each; ...' (the engine's
    split: as even as it goes, the first clients taking one more)."""
    low, extra = divmod(batch, clients)
    each = f"{low} each" if not extra else f"{low + 1} or {low} each"
    return (
        f"The {count_of(batch, 'private image')} are split over {clients} clients in order, "
        f"{each}; the server sees only the sum of their updates."
    )


def _observed_scenario(lab: LabChoices, setup: Setup) -> None:
    """An observed update: the threat model is the honest server that received it, the
    protocol the bundle's (said, not chosen)."""
    assert setup.bundle is not None
    st.caption(
        "Threat model: the honest server that received this update (an observed update is "
        "audited as it was received: no model of the server's own, no secure aggregation). "
        f"Client protocol: the bundle's ({protocol_words(setup.bundle.protocol)})."
    )
    assumed = setup.bundle.training.assumed_words
    if assumed:  # said before the run, as on its threat card and in its PDF
        st.warning(  # training.json's words (a recorder's notes): shown as typed
            "Assumed, not reported by the client (the attack simulates these; the result is "
            "the client's only if they hold): " + literal("; ".join(assumed))
        )
    lab.server, lab.secure_aggregation = "honest", None


def scenario_inputs(lab: LabChoices, batch: int | None = None) -> None:
    st.header("Scenario")
    setup = current_setup()
    if setup.bundle is not None:
        _observed_scenario(lab, setup)
    else:
        _protocol_inputs(lab, batch)
    _knowledge_inputs(lab)


def _protocol_inputs(lab: LabChoices, batch: int | None) -> None:
    threat_inputs(lab, batch)
    default = ClientProtocol()
    lab.algorithm = st.radio(
        "Client protocol",
        get_args(Algorithm),
        format_func=lambda a: ALGORITHM_WORDS.get(a, a),
        horizontal=True,
        persist_state="session",
        key=persist("algorithm", default.algorithm),
        help="FedSGD: the client sends one gradient of its whole batch. FedAvg: it takes "
        "local SGD steps and sends the change of its weights.",
    )
    if lab.algorithm == "fedavg":
        lab.local_steps = int(
            st.number_input(
                "Local steps",
                1,
                1000,
                step=1,
                persist_state="session",
                key=persist("local_steps", default.local_steps),
            )
        )
        lab.local_lr = st.number_input(
            "Local learning rate",
            format="%g",
            persist_state="session",
            key=persist("local_lr", default.local_lr),
        )
        local_batch = int(
            st.number_input(
                "Local mini-batch size (0 = whole batch)",
                0,
                64,
                step=1,
                persist_state="session",
                key=persist("local_batch_size", 0),
            )
        )
        lab.local_batch_size = local_batch or None
        lab.share = st.radio(
            "Client sends",
            get_args(Shared),
            format_func=lambda s: SHARED_WORDS.get(s, s),
            horizontal=True,
            persist_state="session",
            key=persist("share", default.shared),
        )


def _knowledge_inputs(lab: LabChoices) -> None:
    lab.labels_known = st.checkbox(
        "Server knows the labels",
        persist_state="session",
        key=persist("labels_known", False),
        help="Threat model: the client shares its labels with the server.",
    )
    lab.attacker_knows_defense = st.checkbox(
        "Attacker knows the defense",
        persist_state="session",
        key=persist("attacker_knows_defense", True),
        help="Threat model: beside each attack, run its adaptive twin, which knows the "
        "defense's mechanism and public parameters (not its secrets) and matches through "
        "it. The verdict takes the stronger. Off: the plain attack only, as the papers' own "
        "comparisons.",
    )


@signed_in_only
def _use_paper_iterations(attack: str, preset: str | None, count: int) -> None:
    st.session_state[f"iterations.{attack}.{preset}"] = count


def attack_names(server: str) -> list[str]:
    """The attacks of the threat model, then every applicable attack: under the malicious
    server those that build the model it sends (``AttackInfo.builds``), else the others."""
    malicious = server == "malicious"
    return [
        *sorted(n for n, info in ATTACKS.items() if (info.builds is not None) == malicious),
        ALL_ATTACKS,
    ]


def attack_inputs(lab: LabChoices) -> None:
    st.header("Attack")
    names = attack_names(lab.server)
    # One field per threat model: switching back finds the attack chosen for it before.
    key, default = ("attack", "dlg") if lab.server == "honest" else (f"attack.{lab.server}", "rtf")
    lab.attack = st.selectbox(
        "Attack",
        names,
        format_func=attack_label,
        persist_state="session",
        key=persist(key, default if default in names else names[0]),
        help=f"The attacks of the chosen threat model. '{ALL_ATTACKS_LABEL}' runs each of "
        "them at its audit settings, one after the other, and scores each image by the attack "
        "that recovered it best (the worst case).",
    )
    if lab.attack == ALL_ATTACKS:
        st.caption(
            "Every attack that applies, each at its audit settings (strongest, raced restarts); "
            "each image is scored by the attack that recovered it best. Settings and attack "
            "parameters are each attack's own."
        )
        lab.preset, lab.attack_params = None, {}
        if all(ATTACKS[n].closed_form for n in names if n != ALL_ATTACKS):
            st.caption("Closed forms: each reads the images back in one pass, no iterations.")
            lab.iterations = 1
        else:
            lab.iterations = _iterations_input(lab.attack, None)
            _planned_caption(lab)
        return
    info = ATTACKS[lab.attack]
    st.caption(info.summary)
    presets = [*info.presets, None]  # the audit preset is listed first: it is the default
    lab.preset = st.selectbox(
        "Settings",
        presets,
        format_func=preset_label,
        persist_state="session",
        key=persist(f"preset.{lab.attack}", presets[0]),
        help="'audit' is the strongest configuration for an audit's budget (restarts that "
        "race, the default); 'paper settings' reproduce the attack's paper, with the paper's "
        "iteration count; 'library defaults' are the library's. Every value can be changed "
        "under 'Attack parameters'.",
    )
    if lab.preset == "audit" and info.audit is not None:
        st.caption(f"Audit settings: {info.audit.why}.")
    if info.closed_form:
        st.caption("A closed form: the server reads the images back in one pass, no iterations.")
        lab.iterations = default_iterations(lab.attack, lab.preset)
    else:
        lab.iterations = _iterations_input(lab.attack, lab.preset)
    if info.paper_iterations and not info.closed_form:
        st.button(
            f"Paper's count: {info.paper_iterations:,} iterations",
            key=f"paper_iterations.{lab.attack}",
            on_click=_use_paper_iterations,
            args=(lab.attack, lab.preset, info.paper_iterations),
            help="Set the iterations to the paper's; such a run can take a long time.",
        )
    defaults = config_defaults(
        info.config_type, info.presets.get(lab.preset) if lab.preset else None
    )
    with st.expander("Attack parameters"):
        st.caption(f"Shown: {preset_label(lab.preset)}. Only changed values are recorded.")
        values = config_inputs(info.config_type, f"attack.{lab.attack}.{lab.preset}", defaults)
    lab.attack_params = changed_params(values, defaults)
    if not info.closed_form:
        _planned_caption(lab)


def _planned_caption(lab: LabChoices) -> None:
    """The iterations are per start, the run counts every start's steps: that count under
    the field too, so the sidebar, the estimate and the progress say one number (a race's
    rungs sit on the dashboard's event grid, ``EMIT_EVERY``, as its runs place them)."""
    try:
        component = ComponentSpec.of(lab.attack, lab.attack_params, lab.preset)
        planned = plan_attacks(component, lab.iterations, EMIT_EVERY, server=lab.server)
    except AuditInputError:
        return  # the lab's own check says why
    steps = sum(p.planned_steps for p in planned)
    if steps != lab.iterations:
        st.caption(
            f"{steps:,} planned steps in all (every start's steps, every attack's): the "
            "count the estimate and the progress show (with a defense, its attacker that "
            "knows it may add its own)."
        )


def _iterations_input(attack: str, preset: str | None) -> int:
    """The step budget per start; its default follows the chosen settings (one field per
    attack and settings, so switching settings brings that setting's count)."""
    return int(
        st.number_input(
            "Iterations",
            1,
            1_000_000,
            step=1,
            persist_state="session",
            key=persist(f"iterations.{attack}.{preset}", default_iterations(attack, preset)),
            help="Steps per start of the attack (the audit settings race several starts). "
            "The time budget stops it too.",
        )
    )


def defense_inputs(lab: LabChoices) -> None:
    st.header("Defense")
    if current_setup().bundle is not None:
        st.caption(
            "None: an observed update is what the client sent, with whatever defense it "
            "applied; nothing is added to it afterwards."
        )
        lab.defense, lab.defense_params = "none", {}
        return
    names = sorted(DEFENSES, key=lambda n: (n != "none", n))
    lab.defense = st.selectbox(
        "Defense", names, persist_state="session", key=persist("defense", names[0])
    )
    info = DEFENSES[lab.defense]
    st.caption(info.summary)
    defaults = config_defaults(info.config_type)
    values = config_inputs(info.config_type, f"defense.{lab.defense}", defaults)
    lab.defense_params = changed_params(values, defaults)


def budget_inputs(lab: LabChoices, *, batch: bool = False) -> None:
    """The time budget (per run) and the device. Compare and Trade-off keep a budget of their
    own, with a larger default: they run two attacks at a time, each slower than alone."""
    st.header("Budget")
    if batch:
        key, default = "batch_time_budget", BATCH_TIME_BUDGET_S
        help_text = (
            "Per run: each run's attack stops when this time is up and is scored as it "
            "stands (the utility training is not counted). The runs of a comparison or sweep "
            "run two at a time, each slower than a lone run, so the default is larger than "
            "the Attack lab's; a run stopped by it recovered what it could in that time."
        )
    else:
        key, default = "time_budget", LAB_TIME_BUDGET_S
        help_text = (
            "Per run (the undefended control of a defended run gets the same): the attack "
            "stops when this time is up and is scored as it stands. Under a defense the "
            "attacker that knows it gets the same budget again, so the run may take twice."
        )
    # The most this service allows one run (AUDIT_MAX_RUN_SECONDS), so the field says it.
    limit = int(shared_manager().limits.max_run_seconds)
    lab.time_budget = float(
        st.number_input(
            "Time budget per run (seconds)",
            1,
            limit,
            step=10,
            persist_state="session",
            key=persist(key, min(default, limit)),
            help=f"{help_text} This service allows at most {limit:,} s per run.",
        )
    )
    lab.device = st.selectbox(
        "Device",
        DEVICES,
        persist_state="session",
        # Ray asked only while the session has no choice yet (a new session, or Ray up since).
        key=persist("device", st.session_state.get("device") or shared_manager().default_device()),
        help="cuda asks Ray for one GPU (on this machine or a cluster's worker); the default "
        "is cuda where Ray offers one, else cpu.",
    )


def utility_inputs() -> tuple[UtilitySpec | None, str | None]:
    """Whether (and how long) to measure each defense's cost with federated training; the
    library's objection to the values, if any."""
    st.header("Utility")
    measure = st.checkbox(
        "Measure utility",
        persist_state="session",
        key=persist("utility.on", True),
        help="After the attack, train the model with FedAvg under the same defense and "
        "report the test accuracy: the defense's cost.",
    )
    if not measure:
        return None, None
    default = UtilitySpec()
    dataset = st.selectbox(
        "Training data",
        list(UTILITY_DATASETS),
        persist_state="session",
        key=persist("utility.dataset", default.dataset),
    )
    rounds = st.number_input(
        "Rounds", 1, 1000, step=1, persist_state="session", key=persist("utility.rounds", 5)
    )
    clients = st.number_input(
        "Clients", 1, 100, step=1, persist_state="session", key=persist("utility.clients", 3)
    )
    train = st.number_input(
        "Training examples",
        10,
        60_000,
        step=100,
        persist_state="session",
        key=persist("utility.train", default.train),
    )
    seconds = st.number_input(
        "Training time budget (s)",
        1,
        86_400,
        step=30,
        persist_state="session",
        key=persist("utility.seconds", int(default.seconds)),
        help="The training stops here, before the next client trains, and reports the rounds "
        "it finished as incomplete: a defense with a costly client step (Soteria) would "
        "otherwise hold its run long after the attack.",
    )
    test = default.test if dataset == "fashion-mnist" else 300  # digits: 1797 in all
    try:
        federation = dataclasses.replace(
            default.federation, rounds=int(rounds), clients=int(clients)
        )
        return UtilitySpec(dataset, int(train), test, federation, float(seconds)), None
    except AuditInputError as exc:
        return None, f"Utility: {exc}"


def run_inputs(lab: LabChoices, setup: Setup, *, batch: bool = False) -> None:
    """The sidebar of a page that runs the Setup under one scenario, attack and defense (the
    Attack lab, the Sample page): their choices into ``lab``."""
    with st.sidebar:
        scenario_inputs(lab, batch_size(setup))
        attack_inputs(lab)
        defense_inputs(lab)
        budget_inputs(lab, batch=batch)


def batch_form(title: str) -> tuple[Setup, LabChoices, UtilitySpec | None, list[str], list[str]]:
    """The Compare and Trade-off pages' common top: title, sidebar, the model line.

    Returns the setup, the lab choices, the utility setting, and the problems found so far
    (errors, then things still missing), for the page to add its own and show.
    """
    st.title(title)
    setup = current_setup()
    lab = LabChoices()
    with st.sidebar:
        scenario_inputs(lab, batch_size(setup))
        attack_inputs(lab)
        budget_inputs(lab, batch=True)
        utility, utility_error = utility_inputs()
    info_col, link_col = st.columns([4, 1])
    threat = threat_words(lab.server, lab.secure_aggregation)
    info_col.markdown(
        f"**Model** {setup.model_text()} · attack **{attack_label(lab.attack)}**"
        + (f" · **{threat}**" if threat else "")
    )
    link_col.page_link(SETUP.path, label="Change", icon=":material/tune:")
    errors, missing = setup_problems(setup)
    if setup.bundle is not None:
        errors.append(
            "An observed update is audited in the Attack lab: Compare and Trade-off apply "
            "defenses to a simulated client, and the observed update is what the client sent. "
            "Remove the bundle on the Setup page to compare defenses."
        )
    errors += check_components(lab) + check_clients_fit(setup, lab)
    if utility_error:
        errors.append(utility_error)
    return setup, lab, utility, errors, missing


def batch_title(lab: LabChoices, what: str, setup: Setup) -> str:
    """A comparison's or sweep's title: 'rtf · malicious server · 4 defenses · lenet'."""
    threat = threat_words(lab.server, lab.secure_aggregation)
    parts = [attack_label(lab.attack), threat, what, setup.architecture]
    return " · ".join(p for p in parts if p)


def show_problems(errors: list[str], missing: list[str]) -> bool:
    """Show what blocks a start; True when something does."""
    for message in missing:
        st.info(message)
    for message in errors:
        st.error(message)
    return bool(errors or missing)

"""The sidebar forms of the Attack lab, Compare and Trade-off pages (not a page).

The three pages share one set of widget keys (see ``pages.common.persist``), so a scenario
and attack chosen in the lab are already chosen when the auditor turns to Compare or
Trade-off.
"""

from __future__ import annotations

import dataclasses

import streamlit as st

from auditlib.attacks import ATTACKS
from auditlib.defenses import DEFENSES
from auditlib.errors import AuditInputError
from auditlib.spec import UTILITY_DATASETS, UtilitySpec
from pages.common import (
    SETUP_PAGE,
    LabChoices,
    Setup,
    changed_params,
    check_components,
    config_defaults,
    config_inputs,
    current_setup,
    persist,
    preset_label,
    setup_problems,
)

# A first run should take seconds to minutes, not the paper's hours; the paper's count is
# one click away.
FIRST_RUN_ITERATIONS = {
    "dlg": 100,
    "idlg": 100,
    "ig": 300,
    "gi": 300,
    "grnn": 300,
    "dlm": 100,
    "dlm+": 100,
    "fedleak": 300,
}
DEFAULT_ITERATIONS = 100

# --- the form (sidebar) ---------------------------------------------------------------------


def scenario_inputs(lab: LabChoices) -> None:
    st.header("Scenario")
    lab.algorithm = st.radio(
        "Client protocol",
        ["fedsgd", "fedavg"],
        format_func={"fedsgd": "FedSGD", "fedavg": "FedAvg"}.get,
        horizontal=True,
        persist_state="session",
        key=persist("algorithm", "fedsgd"),
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
                key=persist("local_steps", 1),
            )
        )
        lab.local_lr = st.number_input(
            "Local learning rate",
            format="%g",
            persist_state="session",
            key=persist("local_lr", 0.01),
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
            ["delta", "weights"],
            format_func={"delta": "weight change", "weights": "new weights"}.get,
            horizontal=True,
            persist_state="session",
            key=persist("share", "delta"),
        )
    lab.labels_known = st.checkbox(
        "Server knows the labels",
        persist_state="session",
        key=persist("labels_known", False),
        help="Threat model: the client shares its labels with the server.",
    )


def _use_paper_iterations(attack: str, count: int) -> None:
    st.session_state[f"iterations.{attack}"] = count


def attack_inputs(lab: LabChoices) -> None:
    st.header("Attack")
    names = sorted(ATTACKS)
    lab.attack = st.selectbox(
        "Attack",
        names,
        persist_state="session",
        key=persist("attack", "dlg" if "dlg" in names else names[0]),
    )
    info = ATTACKS[lab.attack]
    st.caption(info.summary)
    presets = [None, *info.presets]
    lab.preset = st.selectbox(
        "Settings",
        presets,
        format_func=preset_label,
        persist_state="session",
        key=persist(f"preset.{lab.attack}", "paper" if "paper" in presets else None),
        help="'paper settings' are the values of the attack's paper; 'library defaults' are "
        "the library's. Every value can be changed under 'Attack parameters'.",
    )
    iterations_key = persist(
        f"iterations.{lab.attack}", FIRST_RUN_ITERATIONS.get(lab.attack, DEFAULT_ITERATIONS)
    )
    lab.iterations = int(
        st.number_input(
            "Iterations",
            1,
            1_000_000,
            step=1,
            persist_state="session",
            key=iterations_key,
            help="A small count keeps a first run short; the time budget stops it too.",
        )
    )
    if info.paper_iterations:
        st.button(
            f"Paper's count: {info.paper_iterations:,} iterations",
            key=f"paper_iterations.{lab.attack}",
            on_click=_use_paper_iterations,
            args=(lab.attack, info.paper_iterations),
            help="Set the iterations to the paper's; such a run can take a long time.",
        )
    defaults = config_defaults(
        info.config_type, info.presets.get(lab.preset) if lab.preset else None
    )
    with st.expander("Attack parameters"):
        st.caption(f"Shown: {preset_label(lab.preset)}. Only changed values are recorded.")
        values = config_inputs(info.config_type, f"attack.{lab.attack}.{lab.preset}", defaults)
    lab.attack_params = changed_params(values, defaults)


def defense_inputs(lab: LabChoices) -> None:
    st.header("Defense")
    names = sorted(DEFENSES, key=lambda n: (n != "none", n))
    lab.defense = st.selectbox(
        "Defense", names, persist_state="session", key=persist("defense", names[0])
    )
    info = DEFENSES[lab.defense]
    st.caption(info.summary)
    defaults = config_defaults(info.config_type)
    values = config_inputs(info.config_type, f"defense.{lab.defense}", defaults)
    lab.defense_params = changed_params(values, defaults)


def budget_inputs(lab: LabChoices) -> None:
    st.header("Budget")
    lab.time_budget = float(
        st.number_input(
            "Time budget (seconds)",
            1,
            86_400,
            step=10,
            persist_state="session",
            key=persist("time_budget", 120),
            help="The attack stops when this time is up and is scored as it stands.",
        )
    )
    lab.device = st.selectbox(
        "Device",
        ["cpu", "cuda"],
        persist_state="session",
        key=persist("device", "cpu"),
        help="cuda asks Ray for one GPU (on this machine or a cluster's worker).",
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
    test = default.test if dataset == "fashion-mnist" else 300  # digits: 1797 in all
    try:
        federation = dataclasses.replace(
            default.federation, rounds=int(rounds), clients=int(clients)
        )
        return UtilitySpec(dataset, int(train), test, federation), None
    except AuditInputError as exc:
        return None, f"Utility: {exc}"


def batch_form(title: str) -> tuple[Setup, LabChoices, UtilitySpec | None, list[str], list[str]]:
    """The Compare and Trade-off pages' common top: title, sidebar, the model line.

    Returns the setup, the lab choices, the utility setting, and the problems found so far
    (errors, then things still missing), for the page to add its own and show.
    """
    st.title(title)
    setup = current_setup()
    lab = LabChoices()
    with st.sidebar:
        scenario_inputs(lab)
        attack_inputs(lab)
        budget_inputs(lab)
        utility, utility_error = utility_inputs()
    info_col, link_col = st.columns([4, 1])
    info_col.markdown(f"**Model** {setup.model_text()} · attack **{lab.attack}**")
    link_col.page_link(SETUP_PAGE, label="Change", icon=":material/tune:")
    errors, missing = setup_problems(setup)
    errors += check_components(lab)
    if utility_error:
        errors.append(utility_error)
    return setup, lab, utility, errors, missing


def show_problems(errors: list[str], missing: list[str]) -> bool:
    """Show what blocks a start; True when something does."""
    for message in missing:
        st.info(message)
    for message in errors:
        st.error(message)
    return bool(errors or missing)

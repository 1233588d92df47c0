"""Compare defenses: one scenario and attack under several defenses, side by side.

The runs are a batch of ordinary runs on the engine (in parallel where Ray has workers),
each with the attack and, if asked, the utility training under its defense. The batch's id
goes into the URL (``?comparison=...``); a stored comparison reopens at once.
"""

from __future__ import annotations

import dataclasses

import streamlit as st

from auditlib.defenses import DEFENSES, build_defense
from auditlib.engine import batches
from auditlib.errors import AuditInputError
from auditlib.spec import ComponentSpec
from dashboard.batch_view import open_batch, start_batch
from dashboard.config_form import changed_params, config_defaults, config_inputs
from dashboard.entry import through_app
from dashboard.forms import batch_form, batch_title, show_problems
from dashboard.run_choices import build_run
from dashboard.state import persist

through_app()  # a run that did not come through app.py goes through it (dashboard/entry.py)

DEFAULT_DEFENSES = ["none", "dp-gaussian", "prune", "soteria"]


def _defense_choices() -> tuple[list[ComponentSpec], list[str]]:
    names = sorted(DEFENSES, key=lambda n: (n != "none", n))
    chosen = st.multiselect(
        "Defenses to compare",
        names,
        persist_state="session",
        key=persist("compare.defenses", DEFAULT_DEFENSES),
        help="'none' is the undefended baseline. Against a malicious server (the threat "
        "model in the sidebar), 'model-check' is the client's own check of the model it "
        "receives; the noise, clipping and pruning defenses act on the update it sends.",
    )
    components, errors = [], []
    for name in chosen:
        info = DEFENSES[name]
        defaults = config_defaults(info.config_type)
        if defaults:
            with st.expander(f"{name} settings"):
                st.caption(info.summary)
                values = config_inputs(info.config_type, f"compare.{name}", defaults)
        else:
            values = {}
        params = changed_params(values, defaults)
        try:
            build_defense(name, params)
        except AuditInputError as exc:
            errors.append(f"{name}: {exc}")
        components.append(ComponentSpec.of(name, params))
    return components, errors


def main() -> None:
    setup, lab, utility, errors, missing = batch_form("Compare defenses")
    components, defense_errors = _defense_choices()
    errors += defense_errors
    if not components:
        missing.append("Tick at least one defense.")
    blocked = show_problems(errors, missing)
    if st.button(
        f"Run the comparison ({len(components)} runs)",
        type="primary",
        key="compare.start",
        disabled=blocked,
    ):
        try:
            base, assets, _ = build_run(setup, lab)
            base = dataclasses.replace(base, utility=utility)
            members = batches.comparison_members(base, components)
        except AuditInputError as exc:
            st.error(f"Not started: {exc}")
        else:
            error = start_batch(
                "comparison",
                batch_title(lab, f"{len(components)} defenses", setup),
                members,
                assets,
            )
            if error:
                st.error(error)

    open_batch("comparison")


main()

"""The whole sample: every batch of the private images one client's update, each audited and
judged on its own, and the verdict over them (the share recovered with its 95 % interval,
each update's figures, the worst case).

One update's verdict is an anecdote (which image happened to be picked decides it); the
sample says how often a client's data comes back. The updates are a batch of ordinary runs
(``?sample=...``); they start as one task that advances them together where their attack has
a batched form (``engine.together``), else side by side where Ray has workers, like a
comparison's.
"""

from __future__ import annotations

import streamlit as st

from auditlib.engine import batches
from auditlib.engine.sample import MAX_UPDATES
from auditlib.engine.together import why_sample_apart
from auditlib.errors import AuditInputError
from dashboard.batch_view import open_batch, start_batch
from dashboard.entry import through_app
from dashboard.forms import batch_title, run_inputs, show_problems
from dashboard.navigation import SETUP
from dashboard.run_choices import (
    LabChoices,
    build_run,
    check_clients_fit,
    check_components,
)
from dashboard.setup_state import current_setup, setup_problems
from dashboard.state import persist

through_app()  # a run that did not come through app.py goes through it (dashboard/entry.py)

MOST_UPDATES = min(MAX_UPDATES, batches.MAX_MEMBERS)


def main() -> None:
    st.title("Audit the sample")
    setup = current_setup()
    lab = LabChoices()
    run_inputs(lab, setup, batch=True)
    st.caption(
        "Every batch of the Setup's private images is one client's update: the Setup's "
        "batch size is each update's, the set is cut in order. Each update is audited as "
        "one run is (beside its own control under a defense) and judged on its own; the "
        "verdict over them gives the share of images recovered with its 95 % interval and "
        "the worst case."
    )
    info_col, link_col = st.columns([4, 1])
    info_col.markdown(f"**Model** {setup.model_text()} · **Each update** {setup.images_text()}")
    link_col.page_link(SETUP.path, label="Change", icon=":material/tune:")
    updates = int(
        st.number_input(
            "Updates",
            1,
            MOST_UPDATES,
            step=1,
            persist_state="session",
            key=persist("sample.updates", 4),
            help=f"How many batches of the set to audit, from its start (at most "
            f"{MOST_UPDATES}); more than the set holds is refused with how many it holds.",
        )
    )
    errors, missing = setup_problems(setup)
    if setup.bundle is not None:
        errors.append(
            "An observed update is one update a client sent; the sample simulates many. "
            "Remove the bundle on the Setup page to audit the sample."
        )
    errors += check_components(lab) + check_clients_fit(setup, lab)
    members = []
    if not errors and not missing:
        try:
            base, assets, _ = build_run(setup, lab)
            members = batches.sample_members(base, updates, assets)
        except AuditInputError as exc:
            errors.append(str(exc))
    if members:
        st.caption(_how_they_run([m.spec for m in members]))
    blocked = show_problems(errors, missing)
    if st.button(
        f"Audit the sample ({len(members) or updates} updates)",
        type="primary",
        key="sample.start",
        disabled=blocked,
    ):
        title = batch_title(lab, f"sample of {len(members)} updates", setup)
        error = start_batch("sample", title, members, assets)
        if error:
            st.error(error)

    open_batch("sample")


def _how_they_run(specs) -> str:
    why = why_sample_apart(specs)
    if why is None:
        return (
            f"The {len(specs)} updates advance together as one batched computation on one "
            "worker, each still its own run and verdict; cancelling one stops them all."
        )
    return f"The updates run as separate runs, side by side where Ray has workers ({why})."


main()

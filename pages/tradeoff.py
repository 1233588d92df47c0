"""Trade-off: sweep a defense's strength and draw the utility-privacy curve.

Each point is an ordinary run: the attack against the defense at that strength, then the
utility training under it. Several defenses share the chart, one curve each. Points appear
as their runs finish; a finished sweep is stored (``?sweep=...``) and reopens at once, and a
point already computed with the same spec is never computed again.
"""

from __future__ import annotations

import dataclasses

import streamlit as st

from auditlib.defenses import DEFENSES, build_defense
from auditlib.engine import batches
from auditlib.errors import AuditInputError
from dashboard.batch_view import open_batch, start_batch
from dashboard.config_form import changed_params, config_defaults, config_inputs
from dashboard.entry import through_app
from dashboard.forms import batch_form, batch_title, show_problems
from dashboard.run_choices import build_run
from dashboard.state import persist

through_app()  # a run that did not come through app.py goes through it (dashboard/entry.py)

# A first grid per defense: from no visible effect to strong (the knob's own units).
DEFAULT_GRIDS = {
    "dp-gaussian": "0.0001, 0.001, 0.01, 0.1, 1",
    "dp-laplace": "0.0001, 0.001, 0.01, 0.1, 1",
    "dlm-dp": "0.000001, 0.00001, 0.0001, 0.001",
    "dlm-sparsify": "0.1, 0.3, 0.5, 0.7, 0.9",
    "prune": "0.1, 0.5, 0.9, 0.99",
    "soteria": "0.1, 0.3, 0.5, 0.8",
    "quantize": "16, 8, 4, 2",
    "clip": "10, 1, 0.1, 0.01",
    "outpost": "0.2, 0.8, 2, 5",
    "shadow": "0.05, 0.19, 0.5",
    "fedkl": "64, 256, 1024",
    "fedboosting": "0.55, 0.75, 0.9, 0.99",
}


def _curves() -> tuple[list[batches.SweepCurve], list[str]]:
    names = sorted(n for n, info in DEFENSES.items() if info.strength)
    chosen = st.multiselect(
        "Defenses to sweep (one curve each)",
        names,
        persist_state="session",
        key=persist("sweep.defenses", ["dp-gaussian"]),
    )
    curves, errors = [], []
    for name in chosen:
        info = DEFENSES[name]
        knob = info.strength
        assert knob is not None
        text = st.text_input(
            f"{name}: values of {knob}",
            persist_state="session",
            key=persist(f"sweep.{name}.grid", DEFAULT_GRIDS.get(name, "")),
            help="Numbers separated by commas; one run per value.",
        )
        defaults = config_defaults(info.config_type)
        with st.expander(f"{name}: other settings"):
            st.caption(info.summary)
            values = config_inputs(info.config_type, f"sweep.{name}", defaults, exclude=(knob,))
        params = changed_params(values, defaults)
        try:
            grid = batches.parse_grid(text, f"{name} {knob}")
            build_defense(name, params)
        except AuditInputError as exc:
            errors.append(str(exc))
            continue
        curves.append(batches.SweepCurve(name, grid, knob, tuple(sorted(params.items()))))
    return curves, errors


def main() -> None:
    setup, lab, utility, errors, missing = batch_form("Utility-privacy trade-off")
    curves, curve_errors = _curves()
    errors += curve_errors
    if utility is None:
        missing.append("Tick 'Measure utility' in the sidebar: a trade-off needs the utility.")
    if not curves and not errors:
        missing.append("Pick at least one defense to sweep.")
    blocked = show_problems(errors, missing)
    points = sum(len(c.values) for c in curves)
    if st.button(
        f"Run the sweep ({points} runs)", type="primary", key="sweep.start", disabled=blocked
    ):
        try:
            base, assets, _ = build_run(setup, lab)
            members = batches.sweep_members(dataclasses.replace(base, utility=utility), curves)
        except AuditInputError as exc:
            st.error(f"Not started: {exc}")
        else:
            title = batch_title(lab, f"sweep of {', '.join(c.defense for c in curves)}", setup)
            error = start_batch("sweep", title, members, assets)
            if error:
                st.error(error)

    open_batch("sweep")


main()

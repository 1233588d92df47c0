"""The run manager as one signed-in user uses it: runs start as theirs, with uploads that
are theirs; they cancel and watch only runs they may see. ``store`` is their
:class:`~auditlib.store.scoped.UserStore`, so ``batches.launch`` and
``controls.start_with_control`` work on it unchanged."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from auditlib.access import Principal
from auditlib.engine.fair_share import WaitReason
from auditlib.engine.runs import RunManager
from auditlib.errors import AuditInputError
from auditlib.spec import RunSpec
from auditlib.store.convert import assets_in_spec
from auditlib.store.records import RunRecord
from auditlib.store.scoped import UserStore


class UserRuns:
    def __init__(self, manager: RunManager, store: UserStore) -> None:
        self.manager = manager
        self.store = store

    @classmethod
    def of(cls, manager: RunManager, principal: Principal) -> UserRuns:
        return cls(manager, UserStore(manager.store, principal))

    @property
    def principal(self) -> Principal:
        return self.store.principal

    @property
    def orphans_failed(self) -> int:
        """How many of this user's runs this server failed because the dashboard process
        running them had stopped (their own count; no one else's)."""
        return self.manager.orphans_failed_of(self.principal.username)

    def start(
        self, spec: RunSpec, assets: Mapping[str, bytes] | None = None, title: str = ""
    ) -> str:
        """Start ``spec`` as this user's run. Every upload it names must be theirs (another
        user's is, to them, not stored), whatever bytes the caller hands in."""
        self._own_uploads(spec)
        return self.manager.start(spec, assets, title, owner=self.principal.username)

    def start_together(
        self,
        specs: Sequence[RunSpec],
        assets: Mapping[str, bytes] | None = None,
        titles: Sequence[str] = (),
    ) -> list[str]:
        """Start a sample's updates as this user's runs, advancing together
        (``RunManager.start_together``); every upload they name must be theirs."""
        for spec in specs:
            self._own_uploads(spec)
        return self.manager.start_together(specs, assets, titles, owner=self.principal.username)

    def one_start(self) -> contextlib.AbstractContextManager[None]:
        """The runs started inside are one Start of this user's (``RunManager.one_start``):
        a run with its control, or a batch's runs, is admitted whole or not at all."""
        return self.manager.one_start(self.principal.username)

    def waiting_reason(self, run_id: str) -> WaitReason | None:
        """Why this user's queued run has not started (``RunManager.waiting_reason``)."""
        self.store.get_run(run_id)  # refuses another user's run
        return self.manager.waiting_reason(run_id)

    def _own_uploads(self, spec: RunSpec) -> None:
        for sha in sorted(assets_in_spec(spec.to_dict())):
            if self.store.get_asset_info(sha) is None:
                raise AuditInputError(
                    f"the upload {sha[:12]}... is not among your uploads in the store; upload "
                    "it on the Setup page"
                )

    def cancel(self, run_id: str) -> None:
        """Cancel this user's run. A run this process holds is known to be theirs without
        the store, so Cancel works while the store is down."""
        held_by = self.manager.owner_of(run_id)
        if held_by is None or not self.principal.may_see(held_by):
            self.store.get_run(run_id)  # refuses another user's run
        self.manager.cancel(run_id)

    def is_active(self, run_id: str) -> bool:
        return self.manager.is_active(run_id)

    def active_runs(self) -> list[str]:
        """The active runs this user may see."""
        visible = []
        for run_id in self.manager.active_runs():
            record: RunRecord | None = self.store.raw.get_run(run_id)
            if record is not None and self.principal.may_see(record.owner):
                visible.append(run_id)
        return visible

    def wait(self, run_id: str, timeout: float | None = None) -> bool:
        self.store.get_run(run_id)
        return self.manager.wait(run_id, timeout)

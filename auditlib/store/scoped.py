"""The store as one signed-in user sees it: their own runs, batches and uploads (an admin's
view holds everyone's). The dashboard reads and writes only through this view, so a page
cannot forget the check: what belongs to someone else is refused with
:class:`~auditlib.access.AccessDenied`, and listings hold only what the user may see.

It offers the reads and writes the pages, the batches and the report use, with the raw
:class:`~auditlib.store.Store`'s signatures; anything else is not reachable through it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

from auditlib.access import Principal
from auditlib.errors import AuditInputError
from auditlib.store.records import (
    AssetInfo,
    AssetRecord,
    BatchRecord,
    EventRecord,
    ImageRecord,
    RunRecord,
)
from auditlib.store.store import Store
from auditlib.words import MB, size_text

_OWN = object()  # runs_for_specs without an owner: the signed-in user's own runs


DEFAULT_QUOTA_MB = 2000  # per user; AUDIT_USER_QUOTA_MB changes it


def user_quota_bytes() -> int:
    """The uploads one user may hold together, in bytes (``AUDIT_USER_QUOTA_MB``, decimal MB)."""
    value = os.environ.get("AUDIT_USER_QUOTA_MB", "").strip()
    try:
        megabytes = float(value) if value else DEFAULT_QUOTA_MB
    except ValueError:
        raise AuditInputError(f"AUDIT_USER_QUOTA_MB must be a number, got {value!r}") from None
    if megabytes <= 0:
        raise AuditInputError(f"AUDIT_USER_QUOTA_MB must be > 0, got {value!r}")
    return int(megabytes * MB)


class UserStore:
    """``store`` seen by ``principal``."""

    def __init__(self, store: Store, principal: Principal) -> None:
        self.raw = store
        self.principal = principal
        self._visible_runs: set[str] = set()

    def __repr__(self) -> str:
        return f"UserStore({self.raw!r}, {self.principal.username!r})"

    @property
    def url(self) -> str:
        return self.raw.url

    @property
    def _listed_owner(self) -> str | None:
        """Whose records a listing holds: the user's own; an admin's, everyone's (None)."""
        return None if self.principal.is_admin else self.principal.username

    # ------------------------------------------------------------------ assets

    def _check_asset(self, sha256: str) -> bool:
        """True if this user may read the upload (the read then says whether it exists);
        False otherwise. An upload of someone else's is, to a user, one that is not stored:
        uploads are named by the hash of their bytes, so a different answer would tell
        anyone holding a file whether somebody uploaded it."""
        return self.principal.is_admin or self.principal.username in self.raw.asset_owners(sha256)

    def put_asset(
        self, kind: str, name: str, data: bytes, meta: Mapping[str, Any] | None = None
    ) -> str:
        """Store the user's upload within their quota (``AUDIT_USER_QUOTA_MB``): bytes they
        already hold cost nothing again; more than the quota is refused, nothing stored."""
        owner = self.principal.username
        held = self.raw.list_assets(owner=owner)
        digest = hashlib.sha256(data).hexdigest()
        if all(a.sha256 != digest for a in held):
            used, quota = sum(a.size for a in held), user_quota_bytes()
            if used + len(data) > quota:
                raise AuditInputError(
                    f"this upload ({size_text(len(data))}) would take your uploads to "
                    f"{size_text(used + len(data))}, over your quota of {size_text(quota)}; "
                    "delete uploads you no longer need (Setup, 'Your uploads in the store')"
                )
        return self.raw.put_asset(kind, name, data, meta, owner=owner)

    def get_asset(self, sha256: str) -> AssetRecord | None:
        if not self._check_asset(sha256):
            return None
        return self.raw.get_asset(sha256, owner=self.principal.username)  # as they named it

    def get_asset_info(self, sha256: str) -> AssetInfo | None:
        if not self._check_asset(sha256):
            return None
        return self.raw.get_asset_info(sha256, owner=self.principal.username)  # as they named it

    def list_assets(self, kind: str | None = None) -> list[AssetInfo]:
        return self.raw.list_assets(kind, owner=self._listed_owner)

    def runs_using_asset(self, sha256: str) -> int:
        """How many of the user's runs use it (an admin: everyone's)."""
        if not self._check_asset(sha256):
            return 0
        return self.raw.runs_using_asset(sha256, owner=self._listed_owner)

    def delete_asset(self, sha256: str) -> AssetInfo | None:
        """An admin deletes the upload (when no run uses it); a user gives up their claim,
        and the bytes go when nobody else holds one and no run uses them."""
        if not self._check_asset(sha256):
            return None
        if self.principal.is_admin:
            return self.raw.delete_asset(sha256)
        return self.raw.release_asset(sha256, self.principal.username)

    # ------------------------------------------------------------------ runs

    def get_run(self, run_id: str) -> RunRecord | None:
        record = self.raw.get_run(run_id)
        if record is None:
            return None
        if not self.principal.may_see(record.owner):
            raise self.principal.refuse(f"run {run_id}", record.owner)
        self._visible_runs.add(run_id)
        return record

    def _check_run(self, run_id: str) -> None:
        if run_id not in self._visible_runs:
            self.get_run(run_id)

    def list_runs(
        self, limit: int = 200, status: str | None = None, *, spec_id: str | None = None
    ) -> list[RunRecord]:
        return self.raw.list_runs(limit, status, spec_id=spec_id, owner=self._listed_owner)

    def events(self, run_id: str, after_seq: int = -1) -> list[EventRecord]:
        self._check_run(run_id)
        return self.raw.events(run_id, after_seq)

    def latest_event(self, run_id: str) -> EventRecord | None:
        self._check_run(run_id)
        return self.raw.latest_event(run_id)

    def image(self, run_id: str, kind: str) -> ImageRecord | None:
        self._check_run(run_id)
        return self.raw.image(run_id, kind)

    def delete_run(self, run_id: str) -> list[AssetInfo]:
        self._check_run(run_id)
        return self.raw.delete_run(run_id)

    def runs_for_specs(
        self, spec_ids: Iterable[str], *, owner: str | object | None = _OWN
    ) -> dict[str, RunRecord]:
        """The runs standing for specs among the user's own runs, or among ``owner``'s (the
        owner of the batch or run being looked at: an admin reads another user's comparison
        with that user's runs; ``None``, a record from before sign-in, looks among all)."""
        if owner is _OWN:
            return self.raw.runs_for_specs(spec_ids, owner=self.principal.username)
        assert owner is None or isinstance(owner, str)
        if not self.principal.may_see(owner):
            raise self.principal.refuse(f"the runs of {owner!r}", owner)
        return self.raw.runs_for_specs(spec_ids, owner=owner)

    # ------------------------------------------------------------------ batches

    def create_batch(self, kind: str, title: str, definition: Mapping[str, Any]) -> str:
        return self.raw.create_batch(kind, title, definition, owner=self.principal.username)

    def get_batch(self, batch_id: str) -> BatchRecord | None:
        batch = self.raw.get_batch(batch_id)
        if batch is not None and not self.principal.may_see(batch.owner):
            raise self.principal.refuse(f"{batch.kind} {batch_id}", batch.owner)
        return batch

    def list_batches(self, kind: str | None = None, limit: int = 200) -> list[BatchRecord]:
        return self.raw.list_batches(kind, limit, owner=self._listed_owner)

    def delete_batch(self, batch_id: str) -> None:
        if self.get_batch(batch_id) is not None:
            self.raw.delete_batch(batch_id)

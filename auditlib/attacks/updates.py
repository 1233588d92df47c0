"""Several updates' starts as rows of one batched computation, each row its own objective.

A sample audit attacks many updates (one client's batch each) of the same model. Their
starts are independent problems that differ only in the target they match, so they can be
stacked as starts are (``UpdateMatcher.together``): one ``torch.func.vmap`` pass computes
every row's candidate update through the one model, and each row's distance is then taken
against its own update's target (:class:`UpdatesMatcher`). A row's value is what its update's
matcher gives it alone, up to float summation order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from auditlib.attacks.low_rank import dense
from auditlib.attacks.objectives import (
    RowTargets,
    UnknownRows,
    UpdateMatcher,
    why_not_together,
)
from auditlib.attacks.row_index import RowIndex
from auditlib.threat import AttackerKnowledge


class UpdatesMatcher:
    """Rows (starts) of U updates: row k matches update ``owners[k]``'s target with that
    update's matcher (:meth:`at` gives the rows' matcher, as ``UpdateMatcher.at`` does)."""

    def __init__(self, matchers: Sequence[UpdateMatcher], owners: Sequence[int]) -> None:
        self.matchers = list(matchers)
        self.owners = list(owners)
        # What an attack fits besides its images (the parameters a defense hides: FedKL's
        # lock): every update's are the same parameters of the same model, so every row
        # fits a row of its own, from the first update's guess (:meth:`unknown_rows`).
        self.unknowns: tuple[torch.Tensor, ...] = self.matchers[0].unknowns
        self.one_distance = _one_distance(self.matchers)
        self._targets: tuple[torch.Tensor, ...] | None = None  # stacked at the first use
        self._gathered: tuple[tuple[int, ...], RowTargets] | None = None
        self._rows: RowIndex | None = None  # on the device of the first rows indexed

    def index(self, rows: Sequence[int], device: torch.device) -> torch.Tensor:
        """``rows`` as a device index, made once per set of rows (``row_index.RowIndex``):
        no copy to the device, so no wait for it, at each step."""
        if self._rows is None:
            self._rows = RowIndex(device)
        return self._rows(rows)

    def restart(self) -> None:
        """Every update's unknown parameters back at the attacker's guess."""
        for matcher in self.matchers:
            matcher.restart()

    def unknown_rows(self, count: int) -> UnknownRows:
        """A row of unknowns per row (start) of any update, each at the attacker's guess:
        ``why_updates_apart`` checked that the updates share the model and the defense."""
        return self.matchers[0].unknown_rows(count)

    def at(self, rows: Sequence[int]) -> _Rows:
        return _Rows(self, list(rows))

    def row_targets(self, owners: Sequence[int]) -> RowTargets:
        """Each row's own update's target, gathered once per set of rows (the rows change
        only when a start is dropped or finishes)."""
        key = tuple(owners)
        if self._gathered is None or self._gathered[0] != key:
            if self._targets is None:  # every update's target, stacked per parameter
                every = zip(*(m.target for m in self.matchers), strict=True)
                self._targets = tuple(torch.stack(ts) for ts in every)
            index = self.index(key, self._targets[0].device)
            self._gathered = key, RowTargets(t.index_select(0, index) for t in self._targets)
        return self._gathered[1]


class _Rows:
    """The matcher of some rows of an :class:`UpdatesMatcher`, in that order."""

    def __init__(self, many: UpdatesMatcher, rows: list[int]) -> None:
        self.many = many
        self.rows = rows
        self.owners = [many.owners[r] for r in rows]

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, *args) -> torch.Tensor:
        """One row's objective: its own update's matcher, alone."""
        (owner,) = set(self.owners)
        return self.many.matchers[owner](images, labels, *args)

    def together(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        extra: torch.Tensor | None = None,
        *,
        distance=None,
        unknowns: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """One value per row: the rows' updates in one ``vmap`` pass through the shared model
        (the first update's matcher: ``why_updates_apart`` checked they share it), then each
        update's rows measured against that update's target (one distance call per update,
        on its rows stacked, as ``UpdateMatcher.together`` measures its restarts). ``extra``:
        one value per row the measure also takes (DLM's gamma), or None; ``distance``: one
        in place of the matchers' own for the plain attacker (GRNN's summed squares), as
        ``UpdateMatcher.together`` takes it; ``unknowns``: the rows' own fitted unknowns
        (``UnknownRows.rows``), as ``UpdateMatcher.together`` takes them.

        A matcher here has ``stacked_updates(images, labels)`` and ``measured(updates,
        images, extra)`` (``UpdateMatcher``, ``ModelLeakageObjective``)."""
        updates = self.stacked_updates(images, labels, unknowns)
        return self.measured(updates, images, extra, distance=distance)

    def stacked_updates(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        unknowns: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """The rows' candidate updates in one ``vmap`` pass through the shared model (the
        first update's matcher), as ``UpdateMatcher.stacked_updates`` gives them."""
        first = self.many.matchers[self.owners[0]]
        if unknowns:
            return first.stacked_updates(images, labels, unknowns)
        return first.stacked_updates(images, labels)  # DLM's objective takes no unknowns

    @property
    def target(self) -> RowTargets:
        """Each row's own update's target (``UpdateMatcher.target``: one for every row)."""
        return self.many.row_targets(self.owners)

    def measured(
        self,
        updates: Sequence[torch.Tensor],
        images: torch.Tensor,
        extra: torch.Tensor | None = None,
        *,
        distance=None,
    ) -> torch.Tensor:
        """:meth:`together`'s second half: the rows' stacked updates (from the first
        update's matcher) each measured against its own update's target."""
        matchers = self.many.matchers
        first = matchers[self.owners[0]]
        if distance is not None and extra is not None:
            raise ValueError("a distance and a per-row extra value are not taken together")
        if len(set(self.owners)) == 1:
            return first.measured(updates, images, extra if distance is None else distance)
        same = distance is None or distance is first.distance
        if self.many.one_distance and extra is None and same:
            # One distance call over every row, each against its own update's target: one
            # call per update launched U times the kernels, most of a GPU step (issue 34).
            return first.distance(updates, self.many.row_targets(self.owners))
        # Each update's rows made contiguous (a no-op where they are, as the loop's sorted
        # rows are) and split, not picked out one update at a time: a pick's backward writes
        # a gradient the size of all rows, so U picks would cost U times the whole batch.
        updates = dense(updates)  # factored entries formed: this path picks rows apart
        order = sorted(range(len(self.rows)), key=lambda i: self.owners[i])
        if order != list(range(len(order))):
            index = self.many.index(order, images.device)
            updates = tuple(u.index_select(0, index) for u in updates)
            images = images.index_select(0, index)
            extra = None if extra is None else extra.index_select(0, index)
        owners = [self.owners[i] for i in order]
        sizes = [owners.count(u) for u in dict.fromkeys(owners)]
        pieces = [torch.split(u, sizes) for u in updates]
        extras = [None] * len(sizes) if extra is None else torch.split(extra, sizes)
        values = torch.cat(
            [
                matchers[owner].measured(
                    tuple(p[g] for p in pieces), part, extras[g] if distance is None else distance
                )
                for g, (owner, part) in enumerate(
                    zip(dict.fromkeys(owners), torch.split(images, sizes), strict=True)
                )
            ]
        )
        if order == list(range(len(order))):
            return values
        back = [0] * len(order)
        for position, row in enumerate(order):
            back[row] = position
        return values.index_select(0, self.many.index(back, images.device))  # the rows' own order


def _one_distance(matchers: Sequence[UpdateMatcher]) -> bool:
    """Whether one distance call can measure every row against its own update's target:
    plain matchers (no release likelihood, so no prior) sharing one distance. Else each
    update's rows are measured by its own matcher."""
    plain = all(
        type(m) is UpdateMatcher and m.view.noise is None and m.distance is matchers[0].distance
        for m in matchers
    )
    return plain and len(matchers) > 1


def same_model(knowledges: Sequence[AttackerKnowledge]) -> bool:
    """Whether the updates were computed from one model: equal architecture, parameters and
    buffers (each update's audit builds its own copy of the global model)."""
    first = knowledges[0].model
    ours = dict(first.state_dict())
    for knowledge in knowledges[1:]:
        other = knowledge.model.state_dict()
        if type(knowledge.model) is not type(first) or other.keys() != ours.keys():
            return False
        if not all(torch.equal(ours[k], other[k]) for k in ours):
            return False
    return True


def _same_mask(a: AttackerKnowledge, b: AttackerKnowledge) -> bool:
    masks = [None if k.defense is None else k.defense.mask for k in (a, b)]
    if masks[0] is None or masks[1] is None:
        return masks[0] is None and masks[1] is None
    return all(torch.equal(x, y) for x, y in zip(*masks, strict=True))


def why_updates_apart(knowledges: Sequence[AttackerKnowledge]) -> str | None:
    """Why these updates' starts cannot be rows of one batched computation (None: they can):
    each update's own reason its restarts run apart, or updates that differ in anything but
    their target (the model, the client's protocol, the batch's shape, the device, what the
    attacker knows of a defense)."""
    if len(knowledges) < 2:
        return "one update"
    for knowledge in knowledges:
        reason = why_not_together(knowledge)
        if reason is not None:
            return reason
    first = knowledges[0]
    for knowledge in knowledges[1:]:
        if knowledge.protocol != first.protocol:
            return "the updates' client protocols differ"
        if (knowledge.batch_size, knowledge.input_shape, knowledge.num_classes) != (
            first.batch_size,
            first.input_shape,
            first.num_classes,
        ):
            return "the updates' batches differ in shape"
        if str(knowledge.device) != str(first.device):
            return "the updates are on different devices"
        if knowledge.normalization != first.normalization:
            return "the updates' normalisations differ"
        # The first update's view transforms every row's update: a known defense's
        # transform is its configuration's (clipping, quantisation), the same on each update.
        if (knowledge.defense is None) != (first.defense is None) or (
            knowledge.defense is not None and knowledge.defense.name != first.defense.name
        ):
            return "the attacker knows a different defense on each update"
        if not _same_mask(knowledge, first):
            # The candidate's update goes through one mask in the batched pass.
            return "the defense leaves different coordinates visible on each update"
    if not same_model(knowledges):
        return "the updates were computed from different models"
    return None

"""K DLM/DLM+ starts advanced together: images, label logits and DLM's gamma stacked one row
per start, each row's objective its own, computed for the running rows in one
``ModelLeakageObjective.together`` pass (``attacks.dlm``).

Two optimisers:

- L-BFGS (the paper's LeNet): one batched L-BFGS (``lbfgs.LbfgsTogether``), a history, step
  size and stopping tests per start; its evaluation can be recorded as a CUDA graph. A lone
  start, or starts apart, run on torch's own L-BFGS instead (``dlm._Restarts``).
- Adam (the paper's MLP, lr 0.1): every start is a row here, one row each when alone or
  apart. Adam is elementwise, so one ``torch.optim.Adam`` over the stacked rows is each
  start's own (every running start takes every step, so the step count they share is each
  one's). A dropped start's rows get no gradient and are never read again. Nothing is read
  back in a step: a start whose objective or images stop being finite has the variables it
  had before that step kept on the device (``FirstBroken``), which is the last finite step
  a start keeps, and the loop drops it at its next read.
"""

from __future__ import annotations

import math

import torch

from auditlib.attacks.base import snapshot
from auditlib.attacks.lbfgs import LbfgsTogether, RecordedRows
from auditlib.attacks.lbfgs_batched import take_rows
from auditlib.attacks.loop import stacked_starts
from auditlib.attacks.objectives import backward_to, total_variation
from auditlib.attacks.row_index import FirstBroken, RowIndex


class Starts:
    """K DLM/DLM+ starts together (module docstring): L-BFGS or Adam, as ``config`` says."""

    def __init__(
        self, generators, objective, knowledge, config, fixed_labels, gamma0, clock, nominal
    ):
        device = knowledge.device
        self.objective = objective  # a ModelLeakageObjective, or several updates' (at(rows))
        self.nominal = nominal  # the nominal gamma (the same for every update's rows)
        self.config = config
        self.fixed = fixed_labels
        self.fixed_rows = fixed_labels is not None and fixed_labels.dim() == 2  # K x B
        self.images, self.logits = stacked_starts(knowledge, generators, fixed_labels is not None)
        self.gamma = (
            None
            if gamma0 is None
            else torch.full(
                (len(generators),), gamma0, dtype=torch.float32, device=device
            ).requires_grad_()
        )
        self.variables = [v for v in (self.images, self.logits, self.gamma) if v is not None]
        self.recorded = self.lbfgs = self.adam = None
        if config.optimizer == "lbfgs":
            self.recorded = self._recorded(self.variables, device) if config.captured else None
            self.lbfgs = LbfgsTogether.of(
                self.variables, self.recorded or self._objective, clock, len(generators), config
            )
        else:
            self.adam = torch.optim.Adam(self.variables, lr=config.lr)
            self.index = RowIndex(device)
            self.first_broken = FirstBroken(len(generators), device)
        self.gamma_ratio: dict[int, float] = {}  # gamma / nominal gamma at the candidates

    def _take(self, tensor: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """``tensor``'s ``rows``: by an index made once per set of rows with Adam, whose
        steps read nothing back; L-BFGS's evaluations ask for rows as its starts settle."""
        if self.adam is None or rows == list(range(tensor.shape[0])):
            return take_rows(tensor, rows)
        return tensor.index_select(0, self.index(rows))

    def _labels(self, rows: list[int]) -> torch.Tensor:
        if self.logits is not None:
            return torch.softmax(self._take(self.logits, rows), dim=-1)
        return self._take(self.fixed, rows) if self.fixed_rows else self.fixed

    def _terms(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self._take(self.images, rows), self._labels(rows)
        gamma = None if self.gamma is None else self._take(self.gamma, rows)
        objective = self.objective.at(rows)
        if len(rows) == 1:  # one start: plain autograd, the fastest way alone
            single = labels[0] if self.logits is not None or self.fixed_rows else labels
            distance = objective(images[0], single, None if gamma is None else gamma[0])
            distance = distance.unsqueeze(0)
        else:
            distance = objective.together(images, labels, gamma)
        if self.config.tv > 0:
            return distance + self.config.tv * total_variation(images), distance
        return distance, distance

    def _objective(self, rows: list[int]) -> torch.Tensor:
        return self._terms(rows)[0]

    def _recorded(self, variables: list[torch.Tensor], device: torch.device) -> RecordedRows:
        """The evaluations recorded as a CUDA graph: the rows' objectives by one
        ``together`` pass."""

        def objective(images, *rest):  # the rows' images, then logits and gamma if any
            rest = list(rest)
            logits = rest.pop(0) if self.logits is not None else None
            gamma = rest.pop(0) if self.gamma is not None else None
            labels = self.fixed if logits is None else torch.softmax(logits, dim=-1)
            value = self.objective.together(images, labels, gamma)
            if self.config.tv > 0:
                value = value + self.config.tv * total_variation(images)
            return value, {}

        return RecordedRows(variables, objective, device, self.objective)

    def _hard_labels(self, row: int) -> torch.Tensor:
        if self.logits is None:
            return (self.fixed[row] if self.fixed_rows else self.fixed).cpu()
        return self.logits[row].detach().argmax(dim=-1).cpu()

    def step(self, alive):
        rows = list(alive)
        if self.adam is not None:
            losses = {"objective": self._adam_step(rows)}
        else:
            losses = {
                "objective": torch.tensor(self.lbfgs.step(rows)),
                "evaluations": torch.tensor([float(self.lbfgs.evaluations[r]) for r in rows]),
            }
        if self.gamma is not None:
            gamma = self._take(self.gamma.detach(), rows)
            losses["gamma"] = gamma
            losses["gamma_ratio"] = gamma / self.nominal
        return losses

    def _adam_step(self, rows: list[int]) -> torch.Tensor:
        """One Adam step of the running ``rows``: their objectives before it (as a start
        alone reports), not finite where the objective or the images it leads to are not."""
        index = self.index(rows)
        before = [v.detach().index_select(0, index) for v in self.variables]  # copies
        self.adam.zero_grad()
        objective, _ = self._terms(rows)
        backward_to(objective.sum(), self.adam)
        self.adam.step()
        with torch.no_grad():
            images = self.images.index_select(0, index).flatten(1)
            finite = torch.isfinite(objective) & torch.isfinite(images).all(dim=1)
            self.first_broken.keep(index, finite, *before)
            return torch.where(finite, objective, math.nan)

    def frame(self, position):
        return snapshot(self.images[position]), self._hard_labels(position)

    def candidate(self, position):
        if self.lbfgs is not None:
            self.lbfgs.restore([position])  # its last full step, not a cut-short or diverged one
        else:  # a start that broke: the variables it had before that step
            kept = self.first_broken.at(position)
            if kept is not None:
                with torch.no_grad():
                    for variable, value in zip(self.variables, kept, strict=True):
                        variable[position].copy_(value)
        with torch.enable_grad():
            score = float(self._terms([position])[1].detach())
        if self.gamma is not None:
            gamma = float(self.gamma.detach()[position])
            self.gamma_ratio[position] = gamma / self.nominal
        return snapshot(self.images[position]), self._hard_labels(position), score

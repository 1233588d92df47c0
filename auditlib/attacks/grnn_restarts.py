"""GRNN's restarts (``GrnnRestarts``): each a generator of its own, stepped by RMSprop;
several advance together as one stacked set of generator weights, eager or traced, and keep
only the running starts' rows once a race drops some. ``grnn.py`` holds the attack: its
configuration, loss, labels and runs."""

from __future__ import annotations

import copy

import torch
from torch.func import functional_call

from auditlib.attacks.base import snapshot
from auditlib.attacks.captured import CapturedGradient, stepped
from auditlib.attacks.compiled import CompiledGradient
from auditlib.attacks.grnn_generator import build_generator, fit_to_input
from auditlib.attacks.objectives import backward_to, unknown_rows
from auditlib.attacks.row_index import FirstBroken, RowIndex, full_rows, keep_rows
from auditlib.attacks.updates import UpdatesMatcher


class GrnnRestarts:
    """GRNN's restarts: each a generator of its own (fresh weights, a fixed latent) trained
    with RMSprop; several advance together as one stacked set of generator weights.
    ``loss`` is the attack's ``grnn.GrnnLoss`` (not imported: ``grnn`` imports this)."""

    def __init__(self, generators, knowledge, config, loss, fixed_labels, fixed_rows=False) -> None:
        self.knowledge = knowledge
        self.config = config
        self.loss = loss
        # Updates together: a row per start (its update's labels), else one set for all.
        self.fixed_rows = fixed_rows and fixed_labels is not None
        nets, latents = [], []
        for generator in generators:  # per restart: its generator's weights, then its latent
            nets.append(build_generator(knowledge, config, generator))
            shape = (knowledge.batch_size, config.latent_dim)
            latents.append(torch.randn(shape, generator=generator).to(knowledge.device))
        self.latent = torch.stack(latents)
        self.fixed = None if fixed_labels is None else fixed_labels.to(knowledge.device)
        loss.matcher.restart()
        self.compiled: CompiledGradient | CapturedGradient | None = None
        if len(nets) == 1 and not stepped(config):  # a traced step is the stacked one
            self.net, self.weights, self.buffers = nets[0], None, None
            variables = list(self.net.parameters())
        else:  # stacked weights: one leaf per parameter, a slice per restart
            self.weights, self.buffers = torch.func.stack_module_state(nets)
            self.net = copy.deepcopy(nets[0]).to("meta")
            variables = list(self.weights.values())
        # An adaptive attacker's unknown model parameters train with the generator: a row per
        # start where the generators are stacked (a traced step's, one start too), else the
        # model's own.
        self.unknowns = unknown_rows(
            loss.matcher, len(nets) if self.weights is not None else 1, alone_too=stepped(config)
        )
        unknowns = loss.matcher.unknowns if self.unknowns is None else self.unknowns.leaves
        self.optimizer = torch.optim.RMSprop(
            [*variables, *unknowns], lr=config.lr, momentum=config.momentum
        )
        self.shown: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # last frame, by position
        self._index = RowIndex(knowledge.device)  # the running rows, made once per set
        # The starts (positions) whose rows the stacked tensors hold, in order: those still
        # running once some stopped (:meth:`_compact`).
        self.held = list(range(len(nets)))
        # Its images (and its own labels) at the step its objective stopped being finite.
        self.first_broken = FirstBroken(len(nets), knowledge.device)

    def _one(self, weights, buffers, latent):
        """One restart's images in [0, 1], in model space, and its labels."""
        _, height, width = self.knowledge.input_shape
        if weights is None:
            images01, soft = self.net(latent)
        else:
            images01, soft = functional_call(self.net, (weights, buffers), (latent,))
        images01 = fit_to_input(images01, height, width, self.config.fit)
        return images01, self.knowledge.normalization.normalize(images01), soft

    def generate(self, positions):
        """Images in [0, 1], the same in model space and the labels fed to the client, one
        slice per position (fixed labels: one per row where each row has its own, else the
        set all rows share)."""
        if self.weights is None:
            images01, images, soft = self._one(None, None, self.latent[0])
            return (
                images01.unsqueeze(0),
                images.unsqueeze(0),
                self._labels(soft.unsqueeze(0), positions),
            )
        # Every row held running (in order, as the loop keeps them): the stacked tensors as
        # they are. Else index_select, not w[index], whose backward (an accumulating
        # index_put) took 35 % of a step of 8 starts on LeNet (CPU); index_select's is an
        # index_add.
        rows = self._rows(positions)
        if len(rows) == 1:  # one row runs: its slices through the net, without vmap
            (row,) = rows
            weights = {n: w[row] for n, w in self.weights.items()}
            buffers = {n: b[row] for n, b in self.buffers.items()}
            images01, images, soft = self._one(weights, buffers, self.latent[row])
            return images01[None], images[None], self._labels(soft[None], positions)
        index = self._index(rows)
        if len(rows) == len(self.held):
            weights, buffers, latent = self.weights, self.buffers, self.latent
        else:
            weights = {n: w.index_select(0, index) for n, w in self.weights.items()}
            buffers = {n: b.index_select(0, index) for n, b in self.buffers.items()}
            latent = self.latent.index_select(0, index)
        images01, images, soft = torch.func.vmap(self._one)(weights, buffers, latent)
        return images01, images, self._labels(soft, positions)

    def _rows(self, positions) -> list[int]:
        """The rows of the stacked tensors that hold these starts."""
        return [self.held.index(position) for position in positions]

    def _compact(self, alive) -> None:
        """Keep only the running starts' rows: the stacked weights, their RMSprop state and
        the unknowns' rows (``row_index.keep_rows``), buffers and latents, so that a step
        no longer updates the generators of starts a race dropped (measured: RMSprop over
        all 4 rows of the audit preset's race was a third of GRNN's step on LeNet, CPU,
        where a lone start ran 270 of the 350 steps)."""
        index = self._index(self._rows(alive))
        cut = keep_rows(self.optimizer, index)
        self.weights = {n: cut[id(w)] for n, w in self.weights.items()}
        self.buffers = {n: b.index_select(0, index) for n, b in self.buffers.items()}
        self.latent = self.latent.index_select(0, index)
        if self.unknowns is not None:
            self.unknowns.leaves = tuple(cut[id(leaf)] for leaf in self.unknowns.leaves)
        self.held = list(alive)

    def _labels(self, soft: torch.Tensor, positions) -> torch.Tensor:
        if self.fixed is None:
            return soft
        return self.fixed.index_select(0, self._index(positions)) if self.fixed_rows else self.fixed

    def _row(self, labels: torch.Tensor, index: int) -> torch.Tensor:
        """One restart's labels: its soft labels, or the fixed ones all restarts share."""
        return labels[index] if self.fixed is None or self.fixed_rows else labels

    def _terms(self, images, labels, alive):
        if images.shape[0] == 1 and not isinstance(self.loss.matcher, UpdatesMatcher):
            own = None if self.unknowns is None else self.unknowns.row(self._rows(alive)[0])
            mse, wd = self.loss.gradient_terms(images[0], self._row(labels, 0), own)
            return mse.unsqueeze(0), wd.unsqueeze(0)
        own = None
        if self.unknowns is not None:  # each row through its own unknowns
            index = self._index(self._rows(alive))
            own = self.unknowns.rows(lambda leaf: leaf.index_select(0, index))
        return self.loss.stacked_terms(self.loss.matcher.at(alive), images, labels, own)

    def traced(self, device: torch.device, captured: bool = False) -> None:
        """Step by the traced objective from now on, compiled (``attacks.compiled``) or
        recorded as a CUDA graph (``attacks.captured``): the stacked generators' images,
        labels and terms, and the objective's gradient to their weights; one update's (such
        a run attacks updates one after another)."""
        loss, names = self.loss, list(self.weights)
        loss.matcher.factored = False  # a trace cannot register the factored form's hooks
        unknown_names = () if self.unknowns is None else self.unknowns.names
        fitted = len(names) + len(unknown_names)

        def terms(*inputs: torch.Tensor):
            # The rows' weights and fitted unknowns (differentiated), buffers, latents.
            weights = dict(zip(names, inputs[: len(names)], strict=True))
            own = dict(zip(unknown_names, inputs[len(names) : fitted], strict=True))
            buffers = dict(zip(self.buffers, inputs[fitted:-1], strict=True))
            images01, images, soft = torch.func.vmap(self._one)(weights, buffers, inputs[-1])
            labels = soft if self.fixed is None else self.fixed
            mse, wd = loss.stacked_terms(loss.matcher, images, labels, own or None)
            tv = torch.func.vmap(loss.smoothness)(images01)
            objective = mse + wd + loss.tv * tv
            # A broken restart's objective is left out of the step, as in the eager one.
            kept = torch.where(torch.isfinite(objective), objective, 0.0)
            parts = {"objective": objective, "gradient_distance": mse, "wasserstein": wd}
            return kept, parts | {"tv": tv, "images": images, "labels": labels}

        gradient = CapturedGradient if captured else CompiledGradient
        self.compiled = gradient(terms, device)

    def _traced_step(self, alive):
        index = self._index(alive)
        fitted = [*self.weights.values(), *(() if self.unknowns is None else self.unknowns.leaves)]
        rows = [w.index_select(0, index) for w in fitted]
        given = [b.index_select(0, index) for b in self.buffers.values()]
        grads, _, named = self.compiled(*rows, given=(*given, self.latent.index_select(0, index)))
        for leaf, grad in zip(fitted, grads, strict=True):
            leaf.grad = full_rows(leaf, index, grad)
        self.optimizer.step()
        return named

    def step(self, alive):
        if self.compiled is not None:
            named = self._traced_step(alive)
            images, labels, objective = named.pop("images"), named.pop("labels"), named["objective"]
            self._keep(alive, images, labels, torch.isfinite(objective))
            return named
        if self.weights is not None and len(alive) < len(self.held):
            self._compact(alive)
        self.optimizer.zero_grad()
        images01, images, labels = self.generate(alive)
        mse, wd = self._terms(images, labels, alive)
        tv = torch.func.vmap(self.loss.smoothness)(images01)
        objective = mse + wd + self.loss.tv * tv
        finite = torch.isfinite(objective.detach())
        self._keep(alive, images, labels, finite)
        # A broken restart's objective is left out of the step (the loop drops it at its next
        # read of the losses); chosen on the device, not read back at every step.
        kept = torch.where(finite, objective, torch.zeros_like(objective))
        backward_to(kept.sum(), self.optimizer)
        self.optimizer.step()
        return {
            "objective": objective.detach(),
            "gradient_distance": mse.detach(),
            "wasserstein": wd.detach(),
            "tv": tv.detach(),
        }

    def _keep(self, alive, images, labels, finite) -> None:
        """The frames (the output each step was taken from) and, for a restart whose
        objective stopped being finite, its images and own labels at that step."""
        for index, position in enumerate(alive):
            self.shown[position] = (images[index].detach(), self._row(labels, index).detach())
        own_labels = (labels,) if self.fixed is None or self.fixed_rows else ()
        self.first_broken.keep(self._index(alive), finite, images, *own_labels)

    def _hard(self, labels: torch.Tensor) -> torch.Tensor:
        return (labels if self.fixed is not None else labels.argmax(-1)).cpu()

    def frame(self, position):
        # The frame is the output the last step was taken from (one forward per step).
        if position not in self.shown:
            with torch.no_grad():
                _, images, labels = self.generate([position])
            self.shown[position] = (images[0], self._row(labels, 0))
        images, labels = self.shown[position]
        return snapshot(images), self._hard(labels)

    def candidate(self, position):
        """The generator's output after its last step, scored by the gradient terms of
        Eq. 3.4 (MSE + WD; the TV prior is not part of the score)."""
        kept = self.first_broken.at(position)
        if kept is not None:
            images, *own_labels = kept
            labels = own_labels[0] if own_labels else self.fixed
        else:
            with torch.no_grad():
                _, images, labels = self.generate([position])
            images, labels = images[0], self._row(labels, 0)
        # Through its own row of the unknowns, where it fits some.
        own = None if self.unknowns is None else self.unknowns.row(self._rows([position])[0])
        loss, matcher = self.loss, self.loss.matcher
        if isinstance(matcher, UpdatesMatcher):  # its own update's matcher and target
            loss = loss.over(matcher.matchers[matcher.owners[position]])
        with torch.enable_grad():
            mse, wd = loss.gradient_terms(images.detach(), labels.detach(), own)
        return snapshot(images), self._hard(labels), float((mse + wd).detach())

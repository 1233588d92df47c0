"""L-BFGS over K independent problems (starts) that share one objective evaluation.

``torch.optim.LBFGS`` keeps one curvature history, one step size and one set of stopping
tests for everything it optimises, so K starts stacked into it would steer each other.
:class:`BatchedLbfgs` is torch's algorithm (``torch/optim/lbfgs.py``, torch 2.x) run per
start: each start has its own history (s, y pairs and rho), its own two-loop recursion,
step size, line search and stopping tests, and the starts evaluate their objective
together, one forward and backward pass for all of them. A start alone follows torch's
iterates up to float rounding (``tests/test_lbfgs_batched.py``).

How it is batched:

- The variables carry a leading dimension K (one row per start; for K = 1 any shape). The
  objective takes the rows to evaluate and returns one loss per row; the sum is
  back-propagated, so each row gets the gradient of its own loss.
- Each start's control flow is torch's ``step`` (and ``_strong_wolfe``) ported line for
  line as a generator that yields what it needs: an objective value and gradient at a
  point, or a search direction. A driver runs the K generators in lockstep, evaluates every
  requested point in one batched call, and computes every requested direction in one
  batched two-loop recursion over the K histories ([K, 2 x history, N] tensors; see
  :meth:`_Histories.direction` for how the recursion is evaluated), with each new pair
  (y, s) formed for all rows at once. The scalar tests (Armijo, curvature, tolerances) stay
  per start, as torch's are, on numbers each reply carries (max |g|, g . d, max |d|), read
  for every row in one transfer: on a GPU a test of a tensor per start would wait on the
  device K times a round.
- Per-start stopping: a start that meets a stopping test ends its step and waits while the
  others go on (the next evaluations skip it); a start whose loss or variables leave the
  finite numbers is put back at its last full step, marked diverged and skipped from then
  on, without touching the other rows.

Both of torch's line searches run batched: none (a fixed step ``lr``) and "strong_wolfe".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

import torch
from torch.optim.lbfgs import _cubic_interpolate  # torch's own, so interpolation is identical

# The objective: the rows (starts) to evaluate at the variables' current values, and one
# loss per row, in that order, differentiable with respect to the variables.
Objective = Callable[[list[int]], torch.Tensor]


@dataclass
class _Evaluate:
    point: torch.Tensor  # flat [N]: where this start needs its loss and gradient
    along: torch.Tensor | None = None  # a direction d: the reply carries grad . d too


@dataclass
class _Direction:
    """The pair (y, s) = (grad - previous grad, t d), formed for all rows at once."""

    grad: torch.Tensor  # flat [N] gradient at the current point
    previous: torch.Tensor  # the gradient at the previous iteration
    d: torch.Tensor  # the previous iteration's direction ...
    t: float  # ... and step


@dataclass(frozen=True)
class _Evaluated:
    """An evaluation's reply, its scalars read for all rows at once (one transfer from the
    device a round, where a test per start would wait on the device once per start)."""

    loss: float
    grad: torch.Tensor  # never written in place, so kept without torch's clones
    grad_max: float  # max |grad|, torch's tolerance_grad test
    along: float | None  # grad . d where the request named d (the line search's gtd)


@dataclass(frozen=True)
class _Directed:
    d: torch.Tensor
    gtd: float  # grad . d
    d_max: float  # max |d|


_Request = _Evaluate | _Direction
_Coroutine = Generator[_Request, object, float]


def _on(device: torch.device, values: list, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A small tensor of ``values`` (an index by default) on ``device``: on CUDA copied from
    pinned memory without waiting (a copy from pageable memory waits for every kernel
    queued before it)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)


def take_rows(tensor: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``tensor[rows]``: the tensor itself where the rows are all of its rows in order (the
    usual case: no copy), else picked with an index that does not wait on the device."""
    if rows == list(range(tensor.shape[0])):
        return tensor
    return tensor.index_select(0, _on(tensor.device, rows))


@dataclass
class _StartState:
    """What torch keeps in ``optimizer.state`` between steps, for one start."""

    n_iter: int = 0
    func_evals: int = 0
    d: torch.Tensor | None = None
    t: float | None = None
    prev_flat_grad: torch.Tensor | None = None
    prev_loss: float | None = None
    diverged: bool = False


class _Histories:
    """K curvature histories. Each start's (s, y) pairs sit in a ring of ``size`` slots,
    interleaved in one [K, 2 x capacity, N] tensor (row 2a is s_a, row 2a + 1 is y_a; the
    capacity grows to ``size``), with the initial inverse Hessian's scale and the inner
    products s_i . y_j and y_i . y_j of every start's pairs, oldest first ([K, size, size]
    each, updated as pairs come in; the diagonal s_i . y_i is 1 / rho_i, the value torch's
    rho is taken from), which :meth:`direction` needs."""

    def __init__(self, starts: int, size: int, numel: int, like: torch.Tensor) -> None:
        self.size = size
        self.pairs = like.new_zeros(starts, 2 * min(size, 8), numel)
        # Ages past a start's count hold no pair: a diagonal of 1 keeps the solves over them
        # finite (their coefficients are set to 0; see :meth:`direction`).
        self.sy = torch.eye(size, dtype=like.dtype, device=like.device).repeat(starts, 1, 1)
        self.yy = like.new_zeros(starts, size, size)
        self.h_diag = like.new_ones(starts)
        self.count = [0] * starts
        self.head = [0] * starts  # slot of the oldest pair

    def reset(self, row: int) -> None:
        self.count[row], self.head[row] = 0, 0
        self.h_diag[row] = 1.0

    @property
    def capacity(self) -> int:
        return self.pairs.shape[1] // 2

    def _grow(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        extra = min(self.size, max(2 * self.capacity, needed)) - self.capacity
        pad = self.pairs.new_zeros(self.pairs.shape[0], 2 * extra, self.pairs.shape[2])
        self.pairs = torch.cat([self.pairs, pad], 1)

    def _append(self, rows: list[int], y: torch.Tensor, s: torch.Tensor, ys: torch.Tensor):
        """Store each row's new pair (torch's append, and pop(0) when full: the products of
        a full row move up one age, the oldest's dropped)."""
        if not rows:
            return
        slots, full = [], []
        for row in rows:
            if self.count[row] == self.size:  # full: overwrite the oldest (torch's pop(0))
                slots.append(self.head[row])
                self.head[row] = (self.head[row] + 1) % self.size
                full.append(row)
            else:
                slots.append(self.count[row])
                self.count[row] += 1
        if full:  # every start (the usual case) by a slice, not an index
            everyone = len(full) == self.sy.shape[0]
            moved = slice(None) if everyone else _on(y.device, full)
            for matrix in (self.sy, self.yy):
                matrix[moved, :-1, :-1] = matrix[moved, 1:, 1:].clone()  # they overlap
        self._grow(max(slots) + 1)
        index = _on(y.device, rows), _on(y.device, slots)
        self.pairs[index[0], 2 * index[1]] = s
        self.pairs[index[0], 2 * index[1] + 1] = y
        self.h_diag[index[0]] = ys / torch.linalg.vecdot(y, y)

    def _products(self, rows: list[int], vectors: torch.Tensor) -> torch.Tensor:
        """Every stored s and y of each row against its ``vectors`` ([n, c, N]): one pass
        over the history, [n, 2 x capacity, c]. (Computed as vectors x history^T: measured
        1.5 times faster than history x vectors^T, and 4 times faster than with the vectors
        as [n, N, c] columns.)"""
        if rows == list(range(self.pairs.shape[0])):
            return torch.bmm(vectors, self.pairs.transpose(1, 2)).transpose(1, 2)
        return torch.stack([(vectors[i] @ self.pairs[r].T).T for i, r in enumerate(rows)])

    def direction(self, rows: list[int], grad: torch.Tensor, y: torch.Tensor, s: torch.Tensor):
        """Each row's L-BFGS direction after adding its (y, s) pair where y.s > 1e-10.

        torch's two-loop recursion (oldest pair first, each row over its own pairs) with
        its recurrences solved as written but each inner product against the running
        vector expanded over the pairs: s_i . q_(i+1) = -s_i . g - sum_(j>i) al_j s_i . y_j
        in the first loop, y_i . r_i = y_i . r_0 + sum_(j<i) (al_j - be_j) y_i . s_j in the
        second, with y_i . r_0 from y . g and the y . y products. Each loop, multiplied
        through by s_i . y_i = 1 / rho_i, is a triangular solve with the s . y products
        themselves (upper with al, lower transposed with al - be). So a direction costs two
        passes over the history (the products below, then one combination), two
        triangular solves over the pairs and no loop over them, where the two-loop makes
        4 x history dependent vector operations and four passes. Equal in exact
        arithmetic; in floats the sums are ordered otherwise and rho_i's products become
        divisions (tests/test_lbfgs_batched.py: torch's iterates to 1e-10 in float64)."""
        device = grad.device
        ys = torch.linalg.vecdot(y, s)
        keep = (ys > 1e-10).tolist()
        chosen = [i for i, k in enumerate(keep) if k]
        which = _on(device, chosen)
        self._append([rows[i] for i in chosen], y[which], s[which], ys[which])
        # One pass: the history against g, and against the new pairs (for the products).
        if len(chosen) == len(rows):
            new_s, new_y = s, y
        else:
            new_s, new_y = torch.zeros_like(s), torch.zeros_like(y)
            new_s[which], new_y[which] = s[which], y[which]
        products = self._products(rows, torch.stack([grad, new_s, new_y], 1))
        row_index = _on(device, rows)
        h_diag = self.h_diag[row_index].unsqueeze(1)
        longest = max(self.count[r] for r in rows)
        if longest == 0:
            return grad.neg() * h_diag
        # order[r, i]: the slot of row r's i-th oldest pair. A row with fewer pairs than the
        # longest holds stale products past its count (finite: earlier pairs', or the
        # initial identity's); the first solve's right side is 0 there, so its al are 0 and
        # reach no held pair, and the second solve's coefficients there are set to 0.
        age = torch.arange(longest, device=device)
        heads = _on(device, [self.head[r] for r in rows])
        counts = _on(device, [self.count[r] for r in rows])
        order = (heads.unsqueeze(1) + age) % self.size
        held = age < counts.unsqueeze(1)
        by_age = products.view(len(rows), self.capacity, 2, 3).gather(
            1, order.view(len(rows), longest, 1, 1).expand(-1, -1, 2, 3)
        )  # [n, longest, (s, y), (g, new s, new y)]
        if chosen:  # the new pairs' products, at their age (the newest: count - 1)
            owner, newest = row_index[which], counts[which] - 1
            fresh = by_age[which]
            self.sy[owner, newest, :longest] = fresh[:, :, 1, 1]  # s_new . y_b
            self.sy[owner, :longest, newest] = fresh[:, :, 0, 2]  # s_a . y_new
            self.yy[owner, newest, :longest] = fresh[:, :, 1, 2]
            self.yy[owner, :longest, newest] = fresh[:, :, 1, 2]
            self.sy[owner, newest, newest] = ys[which]  # torch's 1 / rho, as computed there
        sy = take_rows(self.sy, rows)[:, :longest, :longest]
        yy = take_rows(self.yy, rows)[:, :longest, :longest]
        s_g = torch.where(held, by_age[:, :, 0, 0], 0.0)
        y_g = by_age[:, :, 1, 0]
        # First loop (newest to oldest): al_i = rho_i s_i . q_(i+1), q_i = q_(i+1) - al_i y_i,
        # i.e. (s_i . y_i) al_i + sum_(j>i) (s_i . y_j) al_j = -s_i . g.
        al = torch.linalg.solve_triangular(sy, -s_g.unsqueeze(2), upper=True)
        # r_0 = h q_0 with q_0 = -g - sum_j al_j y_j; y_i . r_0 without forming q_0.
        y_r = h_diag * (-y_g - torch.bmm(yy, al).squeeze(2))
        al = al.squeeze(2)
        # Second loop (oldest to newest): be_i = rho_i y_i . r_i, r_(i+1) = r_i + c_i s_i with
        # c_i = al_i - be_i: (s_i . y_i) c_i + sum_(j<i) (s_j . y_i) c_j = (s_i . y_i) al_i - y_i . r_0.
        diagonal = sy.diagonal(dim1=1, dim2=2)
        coefficient = torch.linalg.solve_triangular(
            sy.mT, (diagonal * al - y_r).unsqueeze(2), upper=False
        ).squeeze(2)
        coefficient = torch.where(held, coefficient, 0.0)
        # r = h q_0 + sum_i c_i s_i = -h g + sum_i (c_i s_i - h al_i y_i): the second pass.
        weights = grad.new_zeros(len(rows), self.capacity, 2)
        weights[:, :, 0].scatter_(1, order, coefficient)
        weights[:, :, 1].scatter_(1, order, -h_diag * al)
        weights = weights.view(len(rows), 2 * self.capacity)
        if rows == list(range(self.pairs.shape[0])):
            combined = torch.bmm(weights.unsqueeze(1), self.pairs).squeeze(1)
        else:
            combined = torch.stack([weights[i] @ self.pairs[r] for i, r in enumerate(rows)])
        return combined - h_diag * grad


class BatchedLbfgs:
    """K independent L-BFGS problems advanced together (see the module's docstring).

    ``variables``: leaf tensors whose first dimension is K (or any shape when K = 1), each
    row one start's part. The arguments are ``torch.optim.LBFGS``'s. :meth:`step` is one
    ``optimizer.step(closure)`` of every start asked for; :attr:`evaluations` counts each
    start's objective evaluations."""

    def __init__(
        self,
        variables: Sequence[torch.Tensor],
        starts: int,
        *,
        lr: float = 1.0,
        max_iter: int = 20,
        max_eval: int | None = None,
        tolerance_grad: float = 1e-7,
        tolerance_change: float = 1e-9,
        history_size: int = 100,
        line_search_fn: str | None = None,
    ) -> None:
        if line_search_fn not in (None, "strong_wolfe"):
            raise ValueError(f"line search {line_search_fn!r}: only None or 'strong_wolfe'")
        for v in variables:
            if starts > 1 and (v.dim() == 0 or v.shape[0] != starts):
                raise ValueError(f"every variable needs a leading dimension of {starts} starts")
        self.variables = list(variables)
        self.starts = starts
        self.lr = lr
        self.max_iter = max_iter
        self.max_eval = max_eval if max_eval is not None else max_iter * 5 // 4
        self.tolerance_grad = tolerance_grad
        self.tolerance_change = tolerance_change
        self.line_search = line_search_fn
        self._sizes = [v[0].numel() if starts > 1 else v.numel() for v in self.variables]
        numel = sum(self._sizes)
        self._histories = _Histories(starts, history_size, numel, self.variables[0].detach())
        self.states = [_StartState() for _ in range(starts)]
        self.evaluations = [0] * starts
        self.completed = self._flat_rows(list(range(starts)))

    # --- flat views of the rows ----------------------------------------------------------

    def _rows_of(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.reshape(self.starts, -1)

    def _flat_rows(self, rows: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat(
                [take_rows(self._rows_of(v.detach()), rows) for v in self.variables], 1
            )

    def _write_rows(self, rows: list[int], flat: torch.Tensor) -> None:
        index = _on(flat.device, rows)
        offset = 0
        with torch.no_grad():
            for v, size in zip(self.variables, self._sizes, strict=True):
                view = v.view(self.starts, -1)
                view.index_copy_(0, index, flat[:, offset : offset + size])
                offset += size

    def diverged(self, row: int) -> bool:
        return self.states[row].diverged

    def restore(self, rows: Sequence[int]) -> None:
        """The rows back at the end of their last full step (not a line-search trial point
        left by an interruption, nor a diverged state)."""
        rows = list(rows)
        if rows:
            self._write_rows(rows, take_rows(self.completed, rows))

    # --- the lockstep driver -------------------------------------------------------------

    def _evaluate(
        self, objective: Objective, rows: list[int], wanted: list[_Evaluate]
    ) -> list[_Evaluated]:
        self._write_rows(rows, torch.stack([w.point for w in wanted]))
        with torch.enable_grad():
            losses = objective(rows)
            grads = torch.autograd.grad(losses.sum(), self.variables, allow_unused=True)
        flat = torch.cat(
            [
                take_rows(self._rows_of(g), rows) if g is not None else v.new_zeros(len(rows), size)
                for g, v, size in zip(grads, self.variables, self._sizes, strict=True)
            ],
            1,
        )
        for row in rows:
            self.evaluations[row] += 1
        columns = [losses.detach(), flat.abs().amax(1)]
        if any(w.along is not None for w in wanted):
            none = flat.new_zeros(flat.shape[1])
            along = torch.stack([none if w.along is None else w.along for w in wanted])
            columns.append(torch.linalg.vecdot(flat, along))
        # Python floats, as torch's float(closure()): its tests compare in double precision.
        scalars = torch.stack([c.double() for c in columns], 1).tolist()
        return [
            _Evaluated(
                loss=row[0],
                grad=flat[i],
                grad_max=row[1],
                along=row[2] if wanted[i].along is not None else None,
            )
            for i, row in enumerate(scalars)
        ]

    def _directions(self, rows: list[int], wanted: list[_Direction]) -> list[_Directed]:
        grad = torch.stack([w.grad for w in wanted])
        y = grad - torch.stack([w.previous for w in wanted])
        steps = _on(grad.device, [w.t for w in wanted], grad.dtype)
        s = torch.stack([w.d for w in wanted]) * steps.unsqueeze(1)
        d = self._histories.direction(rows, grad, y, s)
        scalars = torch.stack([torch.linalg.vecdot(grad, d), d.abs().amax(1)], 1)
        return [
            _Directed(d=d[i], gtd=gtd, d_max=d_max)
            for i, (gtd, d_max) in enumerate(scalars.double().tolist())
        ]

    @torch.no_grad()
    def step(self, objective: Objective, rows: Sequence[int] | None = None) -> list[float]:
        """One ``optimizer.step`` of each start in ``rows`` (all by default) that has not
        diverged. Returns each row's loss at the start of its step (torch's return value),
        NaN for a row that has diverged (now or before; its variables are then its last
        full step's). An exception from ``objective`` (a budget's interruption) leaves the
        rows mid-step: :meth:`restore` puts them back."""
        rows = list(range(self.starts)) if rows is None else list(rows)
        active = [r for r in rows if not self.states[r].diverged]
        starts = self._flat_rows(active)
        running: dict[int, _Coroutine] = {}
        request: dict[int, _Request] = {}
        points: dict[int, torch.Tensor] = {}
        result: dict[int, float] = {}

        def advance(row: int, value: object) -> None:
            try:
                request[row] = running[row].send(value)
            except StopIteration as done:
                result[row] = done.value
                del running[row], request[row]

        for i, row in enumerate(active):
            points[row] = starts[i].clone()
            running[row] = self._one_step(row, points[row])
            advance(row, None)
        while running:
            asking = [r for r in sorted(request) if isinstance(request[r], _Direction)]
            if asking:
                directed = self._directions(asking, [request[r] for r in asking])
                for row, reply in zip(asking, directed, strict=True):
                    advance(row, reply)
                continue
            evaluating = sorted(request)
            evaluated = self._evaluate(objective, evaluating, [request[r] for r in evaluating])
            for row, reply in zip(evaluating, evaluated, strict=True):
                advance(row, reply)
        if active:
            final = torch.stack([points[r] for r in active])
            self._write_rows(active, final)
            finite = torch.isfinite(final).all(1).tolist()
            good = [
                r for r, ok in zip(active, finite, strict=True) if ok and math.isfinite(result[r])
            ]
            for row in set(active) - set(good):  # the last finite state stands
                self.states[row].diverged = True
                result[row] = math.nan
            self.restore(sorted(set(active) - set(good)))
            if good:
                self.completed[good] = final[[active.index(r) for r in good]]
        return [result.get(r, math.nan) for r in rows]

    # --- one start's step: torch.optim.LBFGS.step, line for line -------------------------
    # Where torch reads a tensor's value (max |g|, g . d, max |d|) the reply carries it, read
    # for every row in one transfer; max |t d| is read as t max |d| (t >= 0). torch's clones
    # of the gradient are left out: no gradient here is written in place.

    def _one_step(self, row: int, x: torch.Tensor) -> _Coroutine:
        state = self.states[row]
        lr, max_iter, max_eval = self.lr, self.max_iter, self.max_eval
        tolerance_grad, tolerance_change = self.tolerance_grad, self.tolerance_change
        point = yield _Evaluate(x)
        loss, flat_grad = point.loss, point.grad
        orig_loss = loss
        current_evals = 1
        state.func_evals += 1
        if point.grad_max <= tolerance_grad:
            return orig_loss
        d, t = state.d, state.t
        prev_flat_grad, prev_loss = state.prev_flat_grad, state.prev_loss
        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state.n_iter += 1
            if state.n_iter == 1:
                d = flat_grad.neg()
                self._histories.reset(row)
                # Once a start: torch's first g . d and its first step's 1 / sum |g|.
                first = torch.stack([flat_grad.dot(d), 1.0 / flat_grad.abs().sum()])
                (gtd, inverse_abs_sum), d_max = first.tolist(), point.grad_max
            else:
                directed = yield _Direction(flat_grad, prev_flat_grad, d, t)
                d, gtd, d_max = directed.d, directed.gtd, directed.d_max
            prev_flat_grad = flat_grad
            prev_loss = loss
            # The first step ever is scaled down by the gradient's size, as torch does.
            t = min(1.0, inverse_abs_sum) * lr if state.n_iter == 1 else lr
            if gtd > -tolerance_change:
                break
            ls_func_evals = 0
            if self.line_search is not None:
                point, t, ls_func_evals = yield from _strong_wolfe(
                    x, t, d, d_max, point, gtd, max_ls=max_eval - current_evals
                )
                loss, flat_grad = point.loss, point.grad
                x.add_(d, alpha=t)
                opt_cond = point.grad_max <= tolerance_grad
            else:
                x.add_(d, alpha=t)
                if n_iter != max_iter:
                    point = yield _Evaluate(x)
                    loss, flat_grad = point.loss, point.grad
                    opt_cond = point.grad_max <= tolerance_grad
                    ls_func_evals = 1
            current_evals += ls_func_evals
            state.func_evals += ls_func_evals
            if n_iter == max_iter:
                break
            if current_evals >= max_eval:
                break
            if opt_cond:
                break
            if d_max * t <= tolerance_change:
                break
            if abs(loss - prev_loss) < tolerance_change:
                break
        state.d, state.t = d, t
        state.prev_flat_grad, state.prev_loss = prev_flat_grad, prev_loss
        return orig_loss


def _interpolate(x1, f1, g1, x2, f2, g2, bounds=None) -> float:
    """torch's ``_cubic_interpolate`` on our float slopes (it takes a square root of a
    tensor): computed in float64 on the CPU, never waiting on a device."""
    g1, g2 = torch.tensor(g1, dtype=torch.float64), torch.tensor(g2, dtype=torch.float64)
    return float(_cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=bounds))


def _strong_wolfe(x, t, d, d_norm, at, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """torch's ``_strong_wolfe``, line for line, asking for its evaluations instead of
    calling an objective (each trial point is x + t d; x itself does not move). ``at`` is
    the evaluation at x and ``d_norm`` max |d|; torch's gradients g are here the
    evaluations that carry them (their losses are the f beside them), and the chosen one is
    returned with t and the count of evaluations."""
    f, g = at.loss, at
    g_new = yield _Evaluate(x.add(d, alpha=t), along=d)
    f_new = g_new.loss
    ls_func_evals = 1
    gtd_new = g_new.along
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    ls_iter = 0
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new], [gtd_prev, gtd_new]
            break
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new, gtd_new
        g_new = yield _Evaluate(x.add(d, alpha=t), along=d)
        f_new = g_new.loss
        ls_func_evals += 1
        gtd_new = g_new.along
        ls_iter += 1
    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]
    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _interpolate(
            bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1]
        )
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                if abs(t - max(bracket)) < abs(t - min(bracket)):
                    t = max(bracket) - eps
                else:
                    t = min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        g_new = yield _Evaluate(x.add(d, alpha=t), along=d)
        f_new = g_new.loss
        ls_func_evals += 1
        gtd_new = g_new.along
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
            bracket[high_pos], bracket_f[high_pos] = t, f_new
            bracket_g[high_pos], bracket_gtd[high_pos] = g_new, gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:
                bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
                bracket_g[high_pos] = bracket_g[low_pos]
                bracket_gtd[high_pos] = bracket_gtd[low_pos]
            bracket[low_pos], bracket_f[low_pos] = t, f_new
            bracket_g[low_pos], bracket_gtd[low_pos] = g_new, gtd_new
    t = bracket[low_pos]
    return bracket_g[low_pos], t, ls_func_evals

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
  back-propagated, so each row gets the gradient of its own loss. Or it returns the rows'
  losses with their gradients already taken (:class:`Graded`: a step recorded as a CUDA
  graph, ``attacks.captured``).
- Each start's control flow is torch's ``step`` (and ``_strong_wolfe``) ported line for
  line as a generator that yields what it needs: an objective value and gradient at a
  point, or a search direction. A driver runs the K generators in lockstep, evaluates every
  requested point in one batched call, and computes every requested direction in one
  batched two-loop recursion over the K histories ([K, 2 x history, N] tensors; see
  :meth:`lbfgs_histories.Histories.direction` for how the recursion is evaluated), with
  each new pair (y, s) formed for all rows at once. The scalar tests (Armijo, curvature,
  tolerances) stay per start, as torch's are, on numbers each reply carries (max |g|,
  g . d, max |d|), read for every row in one transfer: on a GPU a test of a tensor per
  start would wait on the device K times a round.
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

from auditlib.attacks.lbfgs_histories import Histories, small_tensor, take_rows


@dataclass(frozen=True)
class Graded:
    """An objective's reply with the gradients taken: the rows' losses [n] and each
    variable's gradient for those rows ([n, ...], the rows in the order asked)."""

    losses: torch.Tensor
    grads: tuple[torch.Tensor, ...]


# The objective: the rows (starts) to evaluate at the variables' current values, and one
# loss per row, in that order, differentiable with respect to the variables (or Graded).
Objective = Callable[[list[int]], torch.Tensor | Graded]


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
        self._histories = Histories(starts, history_size, numel, self.variables[0].detach())
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
        index = small_tensor(flat.device, rows)
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
            if isinstance(losses, Graded):  # a copy: a recorded step rewrites its gradients
                flat = torch.cat([g.reshape(len(rows), -1) for g in losses.grads], 1)
                losses = losses.losses
            else:
                grads = torch.autograd.grad(losses.sum(), self.variables, allow_unused=True)
                flat = self._flat_gradients(grads, rows)
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

    def _flat_gradients(self, grads, rows: list[int]) -> torch.Tensor:
        """The rows' gradients, one flat row each (zeros for a variable left unused)."""
        return torch.cat(
            [
                take_rows(self._rows_of(g), rows) if g is not None else v.new_zeros(len(rows), size)
                for g, v, size in zip(grads, self.variables, self._sizes, strict=True)
            ],
            1,
        )

    def _directions(self, rows: list[int], wanted: list[_Direction]) -> list[_Directed]:
        grad = torch.stack([w.grad for w in wanted])
        y = grad - torch.stack([w.previous for w in wanted])
        steps = small_tensor(grad.device, [w.t for w in wanted], grad.dtype)
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

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
  batched two-loop recursion over the K histories ([K, history, N] tensors). The scalar
  tests (Armijo, curvature, tolerances) stay per start on Python numbers, as torch's are:
  a few microseconds against milliseconds of objective.
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


@dataclass
class _Direction:
    grad: torch.Tensor  # flat [N] gradient at the current point
    y: torch.Tensor  # gradient change since the previous iteration
    s: torch.Tensor  # step taken since the previous iteration


_Request = _Evaluate | _Direction
_Coroutine = Generator[_Request, object, float]


@dataclass
class _StartState:
    """What torch keeps in ``optimizer.state`` between steps, for one start."""

    n_iter: int = 0
    func_evals: int = 0
    d: torch.Tensor | None = None
    t: torch.Tensor | float | None = None
    prev_flat_grad: torch.Tensor | None = None
    prev_loss: float | None = None
    diverged: bool = False


class _Histories:
    """K curvature histories in [K, capacity, N] ring buffers (capacity grows to ``size``)."""

    def __init__(self, starts: int, size: int, numel: int, like: torch.Tensor) -> None:
        self.size = size
        self.dirs = like.new_zeros(starts, min(size, 8), numel)  # y
        self.stps = like.new_zeros(starts, min(size, 8), numel)  # s
        self.ro = like.new_zeros(starts, size)
        self.h_diag = like.new_ones(starts)
        self.count = [0] * starts
        self.head = [0] * starts  # slot of the oldest pair

    def reset(self, row: int) -> None:
        self.count[row], self.head[row] = 0, 0
        self.h_diag[row] = 1.0

    def _grow(self, needed: int) -> None:
        capacity = self.dirs.shape[1]
        if needed <= capacity:
            return
        extra = min(self.size, max(2 * capacity, needed)) - capacity
        pad = self.dirs.new_zeros(self.dirs.shape[0], extra, self.dirs.shape[2])
        self.dirs = torch.cat([self.dirs, pad], 1)
        self.stps = torch.cat([self.stps, pad], 1)

    def _append(self, rows: list[int], y: torch.Tensor, s: torch.Tensor, ys: torch.Tensor) -> None:
        slots = []
        for row in rows:
            if self.count[row] == self.size:  # full: overwrite the oldest (torch's pop(0))
                slots.append(self.head[row])
                self.head[row] = (self.head[row] + 1) % self.size
            else:
                slots.append(self.count[row])
                self.count[row] += 1
        self._grow(max(slots) + 1)
        index = torch.tensor(rows, device=y.device), torch.tensor(slots, device=y.device)
        self.dirs[index] = y
        self.stps[index] = s
        self.ro[index] = 1.0 / ys
        self.h_diag[index[0]] = ys / torch.linalg.vecdot(y, y)

    def direction(self, rows: list[int], grad: torch.Tensor, y: torch.Tensor, s: torch.Tensor):
        """Each row's L-BFGS direction after adding its (y, s) pair where y.s > 1e-10: torch's
        two-loop recursion, batched over the rows (each over its own pairs, oldest first)."""
        ys = torch.linalg.vecdot(y, s)
        keep = (ys > 1e-10).tolist()
        if any(keep):
            chosen = [i for i, k in enumerate(keep) if k]
            self._append([rows[i] for i in chosen], y[chosen], s[chosen], ys[chosen])
        counts = [self.count[r] for r in rows]
        heads = [self.head[r] for r in rows]
        longest = max(counts)
        device = grad.device
        aligned = len(set(counts)) == 1 and len(set(heads)) == 1
        every_row = rows == list(range(self.dirs.shape[0]))
        row_index = torch.tensor(rows, device=device)
        head_index = torch.tensor(heads, device=device)
        count_index = torch.tensor(counts, device=device)

        def pair(i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
            # Pair i (0 = oldest) of every row: a view when the rows' rings line up.
            if aligned:
                slot = (heads[0] + i) % self.size
                if every_row:
                    return self.stps[:, slot], self.dirs[:, slot], self.ro[:, slot], None
                return self.stps[rows, slot], self.dirs[rows, slot], self.ro[rows, slot], None
            slots = (head_index + i) % self.size
            valid = count_index > i
            return (
                self.stps[row_index, slots],
                self.dirs[row_index, slots],
                self.ro[row_index, slots],
                valid,
            )

        al: list[torch.Tensor] = [grad.new_zeros(())] * longest
        q = grad.neg()
        for i in range(longest - 1, -1, -1):
            s_i, y_i, ro_i, valid = pair(i)
            al[i] = torch.linalg.vecdot(s_i, q) * ro_i
            if valid is not None:  # a row with fewer pairs skips this one
                al[i] = torch.where(valid, al[i], 0.0)
            q.addcmul_(y_i, al[i].unsqueeze(1), value=-1)
        r = q * self.h_diag[row_index].unsqueeze(1)
        for i in range(longest):
            s_i, y_i, ro_i, valid = pair(i)
            coefficient = al[i] - torch.linalg.vecdot(y_i, r) * ro_i
            if valid is not None:
                coefficient = torch.where(valid, coefficient, 0.0)
            r.addcmul_(s_i, coefficient.unsqueeze(1))
        return r


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
            return torch.cat([self._rows_of(v.detach())[rows] for v in self.variables], 1)

    def _write_rows(self, rows: list[int], flat: torch.Tensor) -> None:
        index = torch.tensor(rows, device=flat.device)
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
            self._write_rows(rows, self.completed[rows])

    # --- the lockstep driver -------------------------------------------------------------

    def _evaluate(self, objective: Objective, rows: list[int], points: list[torch.Tensor]):
        self._write_rows(rows, torch.stack(points))
        with torch.enable_grad():
            losses = objective(rows)
            grads = torch.autograd.grad(losses.sum(), self.variables, allow_unused=True)
        flat = torch.cat(
            [
                self._rows_of(g)[rows] if g is not None else v.new_zeros(len(rows), size)
                for g, v, size in zip(grads, self.variables, self._sizes, strict=True)
            ],
            1,
        )
        for row in rows:
            self.evaluations[row] += 1
        # Python floats, as torch's float(closure()): the tests below compare in float64.
        return losses.detach().double().tolist(), flat

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
                wanted = [request[r] for r in asking]
                directions = self._histories.direction(
                    asking,
                    torch.stack([w.grad for w in wanted]),
                    torch.stack([w.y for w in wanted]),
                    torch.stack([w.s for w in wanted]),
                )
                for i, row in enumerate(asking):
                    advance(row, directions[i])
                continue
            evaluating = sorted(request)
            losses, grads = self._evaluate(
                objective, evaluating, [request[r].point for r in evaluating]
            )
            for i, row in enumerate(evaluating):
                advance(row, (losses[i], grads[i]))
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

    def _one_step(self, row: int, x: torch.Tensor) -> _Coroutine:
        state = self.states[row]
        lr, max_iter, max_eval = self.lr, self.max_iter, self.max_eval
        tolerance_grad, tolerance_change = self.tolerance_grad, self.tolerance_change
        loss, flat_grad = yield _Evaluate(x)
        orig_loss = loss
        current_evals = 1
        state.func_evals += 1
        if flat_grad.abs().max() <= tolerance_grad:
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
            else:
                d = yield _Direction(flat_grad, flat_grad.sub(prev_flat_grad), d.mul(t))
            prev_flat_grad = flat_grad.clone()
            prev_loss = loss
            # The first step ever is scaled down by the gradient's size, as torch does.
            t = min(1.0, 1.0 / flat_grad.abs().sum()) * lr if state.n_iter == 1 else lr
            gtd = flat_grad.dot(d)
            if gtd > -tolerance_change:
                break
            ls_func_evals = 0
            if self.line_search is not None:
                loss, flat_grad, t, ls_func_evals = yield from _strong_wolfe(
                    x, t, d, loss, flat_grad, gtd, max_ls=max_eval - current_evals
                )
                x.add_(d, alpha=t)
                opt_cond = flat_grad.abs().max() <= tolerance_grad
            else:
                x.add_(d, alpha=t)
                if n_iter != max_iter:
                    loss, flat_grad = yield _Evaluate(x)
                    opt_cond = flat_grad.abs().max() <= tolerance_grad
                    ls_func_evals = 1
            current_evals += ls_func_evals
            state.func_evals += ls_func_evals
            if n_iter == max_iter:
                break
            if current_evals >= max_eval:
                break
            if opt_cond:
                break
            if d.mul(t).abs().max() <= tolerance_change:
                break
            if abs(loss - prev_loss) < tolerance_change:
                break
        state.d, state.t = d, t
        state.prev_flat_grad, state.prev_loss = prev_flat_grad, prev_loss
        return orig_loss


def _strong_wolfe(x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """torch's ``_strong_wolfe``, line for line, asking for its evaluations instead of
    calling an objective (each trial point is x + t d; x itself does not move)."""
    d_norm = d.abs().max()
    g = g.clone()
    f_new, g_new = yield _Evaluate(x.add(d, alpha=t))
    ls_func_evals = 1
    gtd_new = g_new.dot(d)
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    ls_iter = 0
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.clone()], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.clone()], [gtd_prev, gtd_new]
            break
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(
            t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step)
        )
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new.clone(), gtd_new
        f_new, g_new = yield _Evaluate(x.add(d, alpha=t))
        ls_func_evals += 1
        gtd_new = g_new.dot(d)
        ls_iter += 1
    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]
    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(
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
        f_new, g_new = yield _Evaluate(x.add(d, alpha=t))
        ls_func_evals += 1
        gtd_new = g_new.dot(d)
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
            bracket[high_pos], bracket_f[high_pos] = t, f_new
            bracket_g[high_pos], bracket_gtd[high_pos] = g_new.clone(), gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:
                bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
                bracket_g[high_pos] = bracket_g[low_pos]
                bracket_gtd[high_pos] = bracket_gtd[low_pos]
            bracket[low_pos], bracket_f[low_pos] = t, f_new
            bracket_g[low_pos], bracket_gtd[low_pos] = g_new.clone(), gtd_new
    t = bracket[low_pos]
    return bracket_f[low_pos], bracket_g[low_pos], t, ls_func_evals

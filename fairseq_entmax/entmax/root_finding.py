"""alpha-entmax, sparsemax, alpha-normmax and budget-sparsemax with the entmax package's interface
(entmax.root_finding).

The package finds each threshold by a fixed number of bisection steps; here it is found to the
precision of the dtype, so `n_iter` and `ensure_sum_one` are accepted and change nothing (the
results always sum to 1, or to the budget). alpha >= 1 is this project's alpha_entmax; alpha < 1,
normmax and the budget map are computed here, by the same conventions: -inf scores get weight and
gradient 0, a row of -inf only gives zeros, a row holding a NaN gives NaN, float16/bfloat16 are
computed in float32.
"""

import math
import numbers

import torch
from torch import nn

from fairseq_entmax.normalizers import alpha_entmax, sparsemax
from fairseq_entmax.normalizers._common import (
    NEWTON_TOLERANCE,
    as_row_values,
    check_scores,
    check_values,
    compute_dtype,
    map_rows,
    map_rows_backward,
    shift_rows,
    sparse_map_backward,
)

# Only bounds a pathological case: the searches stop at NEWTON_TOLERANCE.
_MAX_PASSES = 64


def _per_row(value, X, dim, name, what):
    """A float parameter as a float, or a tensor one as a tensor with X.dim() dims, size 1 along
    dim and otherwise 1 or X's size, on X's device (the package's `expand` to X's shape with 1
    along dim)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if not (torch.is_tensor(value) and value.is_floating_point()):
        raise TypeError(f"{name}: {what} must be a float or a floating tensor, got {type(value).__name__}")
    if value.dim() > X.dim():
        raise ValueError(f"{name}: {what} of shape {tuple(value.shape)} has more dims than X {tuple(X.shape)}")
    full = value.reshape((1,) * (X.dim() - value.dim()) + tuple(value.shape))
    fits = all(size in (1, x_size) for size, x_size in zip(full.shape, X.shape))
    if not fits or full.shape[dim] != 1:
        raise ValueError(
            f"{name}: {what} of shape {tuple(value.shape)} does not fit X of shape {tuple(X.shape)} "
            f"with dim={dim} (it must expand to X's shape with 1 along dim)"
        )
    return full.to(X.device)


def _check_positive(alpha, name, what, lower=0.0):
    """Raise a ValueError unless alpha (float or tensor) is finite and above lower."""
    message = f"{name}: {what} must be finite and > {lower:g}, got {{value}}"
    if isinstance(alpha, float):
        if not (math.isfinite(alpha) and alpha > lower):
            raise ValueError(message.format(value=alpha))
    else:
        check_values(alpha, (alpha > lower) & (alpha < math.inf), message)


# alpha-entmax for alpha < 1.
#
# With b = 1 - alpha > 0 and w_i = max(X) - X_i >= 0, the solution is dense,
# p_i = (1 + kappa w_i)^(-1/b) / sum_j (1 + kappa w_j)^(-1/b), for the kappa in (0, b] that solves
# H(mu) = b log S(mu) + mu = 0, with mu = log(kappa / b) and S = sum_i (1 + kappa w_i)^(-1/b) (the
# package's threshold is tau = -b max(X) - b / kappa). Written this way, p is exact to rounding
# for every b (as b -> 0, (1 + kappa w)^(-1/b) -> exp(-w): softmax), and mu, which is small near
# alpha = 1, keeps its digits where the threshold loses them. H is increasing in mu, with
# H(-b log d) <= 0 <= H(0): the search is Newton's method in that bracket, bisecting where a step
# would leave it.


def _below_one_rows(x, out, b, t, e, u):
    """alpha-entmax for alpha = 1 - b < 1 of each row of the block x into out; b (m, 1) > 0; t, e
    and u are scratch blocks."""
    valid = shift_rows(x, out)
    w = out.neg_()  # >= 0, +inf where the score is -inf
    tolerance = NEWTON_TOLERANCE[w.dtype]
    lo = b * -math.log(w.shape[1])
    hi = torch.zeros_like(b)
    mu = hi.clone()
    for _ in range(_MAX_PASSES):
        h, slope = _below_one_value_and_slope(w, b, mu, t, e, u)
        step = -h / slope
        converged = ~(step.abs() > tolerance * b)  # (NaN rows count as converged)
        if bool(converged.all()):
            break
        lo = torch.where(h <= 0, mu, lo)
        hi = torch.where(h <= 0, hi, mu)
        new_mu = mu + step
        outside = ~((new_mu > lo) & (new_mu < hi))
        mu = torch.where(converged, mu, torch.where(outside, (lo + hi) / 2, new_mu))
    _below_one_terms(w, b, mu + step, t, out)
    out.div_(out.sum(dim=-1, keepdim=True))
    if valid is not None:
        out.masked_fill_(~valid, 0.0)


def _below_one_terms(w, b, mu, t, e):
    """t = log(1 + kappa w) and e = (1 + kappa w)^(-1/b) at mu (e = 0 where w = +inf)."""
    torch.mul(w, b * mu.exp(), out=t).log1p_()
    torch.div(t, -b, out=e).exp_()


def _below_one_value_and_slope(w, b, mu, t, e, u):
    """H(mu) and dH / dmu = 1 - sum p q, with q = kappa w / (1 + kappa w) = 1 - exp(-t)."""
    _below_one_terms(w, b, mu, t, e)
    total = e.sum(dim=-1, keepdim=True)
    torch.neg(t, out=u).expm1_().neg_().mul_(e)  # e q, 0 where e = 0
    return b * total.log() + mu, 1.0 - u.sum(dim=-1, keepdim=True) / total


def _below_one_rows_backward(p, g, grad_out, b, need_alpha_grad, log_p, s, pa):
    """Gradient of the scores into grad_out; returns d loss / d alpha per row (or None).

    With u_i = p_i^(-b) (the package's (alpha - 1) X_i - tau), the Jacobian is
    diag(s) - s s^T / sum(s) with s = p / u = p^(2 - alpha), as for alpha > 1. For alpha:
    d log p_i / db at a fixed threshold is A_i = log(p_i)^2 phi(y_i), y_i = -b log p_i >= 0,
    phi(y) = (exp(-y) - 1 + y) / y^2, and the constraint sum p = 1 adds -s_i sum(p A) / sum(s):
    d L / d alpha = -(sum g p A - (sum g s / sum s) sum p A). Every term is positive or a product
    of positive terms: no cancellation as alpha -> 1 (phi -> 1/2, softmax's derivative)."""
    torch.clamp_min(p, torch.finfo(p.dtype).tiny, out=log_p).log_()
    # s = p exp(-y): exactly 0 where p = 0 (log_p is finite)
    torch.mul(log_p, b, out=s).exp_().mul_(p)
    skewed_mean = sparse_map_backward(g, s, grad_out)
    if not need_alpha_grad:
        return None
    y = torch.mul(log_p, -b, out=s)
    # phi by its series where expm1(-y) + y would lose digits, by definition elsewhere.
    series = 0.5 - y * (1 / 6 - y * (1 / 24 - y * (1 / 120 - y * (1 / 720 - y * (1 / 5040 - y / 40320)))))
    phi = torch.where(y < 0.1, series, (torch.expm1(-y) + y) / y.square())
    torch.mul(phi, log_p.square_(), out=pa).mul_(p)  # p A, 0 where p = 0
    g_pa = (g * pa).sum(dim=-1, keepdim=True)
    return skewed_mean * pa.sum(dim=-1, keepdim=True) - g_pa


class _EntmaxBelowOneFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, alpha, dim):
        """alpha: a per-row tensor (from _per_row), every value in (0, 1)."""
        ctx.dim = dim
        if X.numel() == 0:
            out = X.clone()
        else:
            b = 1.0 - as_row_values(alpha, X, dim, compute_dtype(X.dtype))
            out = map_rows(X, dim, _below_one_rows, row_params=(b,), num_scratch=3)
        ctx.save_for_backward(out, alpha)
        return out

    @staticmethod
    def backward(ctx, grad):
        out, alpha = ctx.saved_tensors
        need_alpha_grad = ctx.needs_input_grad[1]
        if out.numel() == 0:
            return torch.zeros_like(out), torch.zeros_like(alpha) if need_alpha_grad else None, None
        b = 1.0 - as_row_values(alpha, out, ctx.dim, compute_dtype(out.dtype))

        def kernel(p, g, grad_out, b_block, log_p, s, pa):
            return _below_one_rows_backward(p, g, grad_out, b_block, need_alpha_grad, log_p, s, pa)

        result = map_rows_backward(
            out, grad, ctx.dim, kernel, row_params=(b,), num_scratch=3, row_result=need_alpha_grad
        )
        if not need_alpha_grad:
            return result, None, None
        grad_scores, grad_alpha = result
        return grad_scores, grad_alpha.sum_to_size(alpha.shape).to(alpha.dtype), None


def entmax_bisect(X, alpha=1.5, dim=-1, n_iter=50, ensure_sum_one=True):
    """alpha-entmax: max_p <X, p> + H_alpha(p) s.t. p >= 0, sum(p) = 1, with H_alpha the Tsallis
    alpha-entropy; differentiable w.r.t. X and alpha.

    Args:
        X: floating tensor of scores.
        alpha: > 0, a float or a floating tensor that expands to X's shape with 1 along dim (one
            alpha per row). 1 is softmax, 1.5 entmax15, 2 sparsemax; below 1 the result is dense.
        dim: the dim to normalize along.
        n_iter: accepted for compatibility: the threshold is found to the dtype's precision.
        ensure_sum_one: accepted for compatibility: the result always sums to 1.

    Returns:
        P of X's shape and dtype, summing to 1 along dim.
    """
    dim = check_scores(X, dim, "entmax_bisect")
    alpha = _per_row(alpha, X, dim, "entmax_bisect", "alpha")
    _check_positive(alpha, "entmax_bisect", "alpha")
    if isinstance(alpha, float):
        if alpha >= 1.0:
            return alpha_entmax(X, alpha, dim)
        alpha = torch.full((1,) * X.dim(), alpha, dtype=compute_dtype(X.dtype), device=X.device)
        return _EntmaxBelowOneFunction.apply(X, alpha, dim)
    below = alpha < 1.0
    if not bool(below.any()):
        return alpha_entmax(X, alpha, dim)
    if bool(below.all()):
        return _EntmaxBelowOneFunction.apply(X, alpha, dim)
    # Rows on both sides of 1: each map on every row, with a harmless alpha on the rows it does not
    # keep (where routes each row's gradient, alpha's included, to the map it keeps).
    dense = _EntmaxBelowOneFunction.apply(X, torch.where(below, alpha, 0.5), dim)
    sparse = alpha_entmax(X, torch.where(below, 1.5, alpha), dim)
    return torch.where(below, dense, sparse)


def sparsemax_bisect(X, dim=-1, n_iter=50, ensure_sum_one=True):
    """sparsemax: the Euclidean projection of X onto the simplex along dim (exact threshold).

    Args:
        X: floating tensor of scores.
        dim: the dim to normalize along.
        n_iter: accepted for compatibility: the threshold is exact.
        ensure_sum_one: accepted for compatibility: the result always sums to 1.

    Returns:
        P of X's shape and dtype, summing to 1 along dim.
    """
    return sparsemax(X, dim)


# alpha-normmax: max_p <X, p> - ||p||_alpha over the simplex. For alpha > 1, p_i is proportional
# to r_i^(1 / (alpha - 1)), r = [X - tau]_+, with tau such that sum_i r_i^(alpha / (alpha - 1)) = 1:
# that tau is the threshold of alpha'-entmax of X alpha / (alpha - 1), alpha' = 2 - 1 / alpha
# (in (1, 2)), whose output is r^(alpha / (alpha - 1)). For alpha <= 1 the norm is concave on the
# simplex and equal to 1 at its vertices: the maximum is the one-hot argmax.


def _one_hot_argmax(z, dim):
    """The one-hot argmax of z along dim (zeros on a row of -inf only, NaN on a row with a NaN)."""
    z_max, argmax = z.max(dim=dim, keepdim=True)
    one_hot = torch.zeros_like(z).scatter_(dim, argmax, 1.0) * (z_max > float("-inf"))
    return torch.where(torch.isnan(z_max), float("nan"), one_hot)


class _NormmaxBisectFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, alpha, dim):
        """alpha: a float > 1, or a per-row tensor (from _per_row)."""
        work = compute_dtype(X.dtype)
        z = X.to(work)
        if torch.is_tensor(alpha):
            alpha = alpha.to(work)
            above = alpha > 1.0
            a = torch.where(above, alpha, 2.0)
        else:
            above, a = None, alpha  # (a float alpha = 2 gives entmax15, exactly)
        r_power = alpha_entmax(z * (a / (a - 1.0)), 2.0 - 1.0 / a, dim, max_alpha=2.0)
        p = r_power.pow_(1.0 / a)
        # (at least tiny: a row of -inf only is 0 / tiny = 0; a NaN row stays NaN)
        p.div_(p.sum(dim=dim, keepdim=True).clamp_min_(torch.finfo(work).tiny))
        if above is not None and not bool(above.all()):
            p = torch.where(above, p, _one_hot_argmax(z, dim))
        ctx.dim = dim
        ctx.alpha = a
        ctx.save_for_backward(p, above)
        return p.to(X.dtype)

    @staticmethod
    def backward(ctx, grad):
        """With h = g - <p, g>, b_i = p_i^(2 - alpha) ||p||_alpha^(alpha - 1) / (alpha - 1) on the
        support (0 off it), the Jacobian is symmetric and its product with g is
        b h - p sum(b h); 0 for alpha <= 1, where the map is piecewise constant."""
        p, above = ctx.saved_tensors
        dim, a = ctx.dim, ctx.alpha
        g = grad.to(p.dtype)
        log_p = torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))
        on_support = p > 0
        norm_power = torch.logsumexp(torch.where(on_support, log_p * a, float("-inf")), dim=dim, keepdim=True)
        scale = torch.exp(norm_power * ((a - 1.0) / a)) / (a - 1.0)
        b = torch.where(on_support, torch.exp(log_p * (2.0 - a)), 0.0) * scale
        bh = b * (g - (p * g).sum(dim=dim, keepdim=True))
        grad_x = bh - p * bh.sum(dim=dim, keepdim=True)
        if above is not None:
            grad_x = torch.where(above, grad_x, 0.0)
        return grad_x.to(grad.dtype), None, None


def normmax_bisect(X, alpha=2, dim=-1, n_iter=50):
    """alpha-normmax: max_p <X, p> - ||p||_alpha s.t. p >= 0, sum(p) = 1; differentiable w.r.t. X
    (as the package's, not w.r.t. alpha).

    Args:
        X: floating tensor of scores.
        alpha: > 0, a float or a floating tensor that expands to X's shape with 1 along dim. For
            alpha <= 1 the solution is the one-hot argmax (gradient 0).
        dim: the dim to normalize along.
        n_iter: accepted for compatibility: the threshold is found to the dtype's precision.

    Returns:
        P of X's shape and dtype, summing to 1 along dim.
    """
    dim = check_scores(X, dim, "normmax_bisect")
    alpha = _per_row(alpha, X, dim, "normmax_bisect", "alpha")
    _check_positive(alpha, "normmax_bisect", "alpha")
    if isinstance(alpha, float) and alpha <= 1.0:
        # (through the Function all the same, for an output that has a gradient, 0)
        alpha = torch.full((1,) * X.dim(), alpha, dtype=compute_dtype(X.dtype), device=X.device)
    return _NormmaxBisectFunction.apply(X, alpha, dim)


# budget-sparsemax: max_p <X, p> - ||p||^2 / 2 s.t. 0 <= p <= 1, sum(p) = B, so p = clip(X - tau, 0,
# 1) with f(tau) = sum_i clip(X_i - tau, 0, 1) = B. f is piecewise linear and nonincreasing, with
# slope minus the number of entries strictly between 0 and 1. The search is Newton's method on f
# (each step solves f = B on the current set of such entries, as Michelot's does for sparsemax),
# kept inside a bracket of the root by bisection; once the set no longer changes, the step is
# exact and the next one is 0.


def _budget_rows(x, out, budget, r):
    """budget-sparsemax of each row of the block x into out, budget (m, 1); r is a scratch
    block."""
    z = out.copy_(x)
    finite = (z > float("-inf")).sum(dim=-1, keepdim=True)
    # A budget beyond the finite entries gives them all 1 (and -inf entries always 0).
    budget = torch.minimum(budget.clamp_min(0.0), finite.to(z.dtype))
    z_max = z.amax(dim=-1, keepdim=True)
    lowest = torch.where(z > float("-inf"), z, float("inf")).amin(dim=-1, keepdim=True)
    no_finite = finite == 0
    z_max = z_max.masked_fill(no_finite, 0.0)
    # f(lowest - 1) = the number of finite entries >= B; f(max - B / finite) <= B.
    lo = lowest.masked_fill(no_finite, 0.0) - 1.0
    hi = z_max - budget / finite.clamp_min(1).to(z.dtype)
    # every finite entry 1: the root is any tau <= lo, which the steps would only approach
    saturated = budget >= finite
    floor = lo
    tau = hi.clone()
    tolerance = 4 * torch.finfo(z.dtype).eps
    for _ in range(_MAX_PASSES):
        torch.sub(z, tau, out=r).clamp_(0.0, 1.0)
        excess = r.sum(dim=-1, keepdim=True) - budget
        # the entries strictly between 0 and 1: r (1 - r) > 0, counted by its sign
        between = torch.addcmul(r, r, r, value=-1.0, out=r).sign_().sum(dim=-1, keepdim=True)
        step = excess / between  # +-inf or NaN where no entry is between: bisect there
        converged = saturated | (excess == 0) | (step.abs() <= tolerance * (1.0 + tau.abs())) | torch.isnan(excess)
        if bool(converged.all()):
            break
        lo = torch.where(excess > 0, tau, lo)
        hi = torch.where(excess > 0, hi, tau)
        new_tau = tau + step
        outside = ~((new_tau > lo) & (new_tau < hi))
        tau = torch.where(converged, tau, torch.where(outside, (lo + hi) / 2, new_tau))
    final = torch.where(converged & (excess != 0) & ~torch.isnan(excess), tau + step, tau)
    z.sub_(torch.where(saturated, floor, final)).clamp_(0.0, 1.0)


class _BudgetBisectFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, budget, dim):
        """budget: a per-row tensor (from _per_row)."""
        ctx.dim = dim
        p = map_rows(X, dim, _budget_rows, row_params=(as_row_values(budget, X, dim, compute_dtype(X.dtype)),))
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        """The Jacobian is diag(s) - s s^T / |s| with s the indicator of 0 < p < 1."""
        (p,) = ctx.saved_tensors
        work = compute_dtype(p.dtype)
        p, g = p.to(work), grad.to(work)
        active = ((p > 0) & (p < 1)).to(work)
        count = active.sum(dim=ctx.dim, keepdim=True).clamp_min(1.0)
        mean = (g * active).sum(dim=ctx.dim, keepdim=True) / count
        return ((g - mean) * active).to(grad.dtype), None, None


def budget_bisect(X, budget=2, dim=-1, n_iter=50):
    """budget-sparsemax: max_p <X, p> - ||p||^2 / 2 s.t. 0 <= p <= 1, sum(p) = budget (exact
    threshold); differentiable w.r.t. X (as the package's, not w.r.t. the budget).

    Args:
        X: floating tensor of scores.
        budget: a float or a floating tensor that expands to X's shape with 1 along dim. A
            budget <= 0 gives zeros, one at least the number of finite scores gives ones there.
        dim: the dim to normalize along.
        n_iter: accepted for compatibility: the threshold is exact.

    Returns:
        P of X's shape and dtype, in [0, 1], summing to the budget along dim.
    """
    dim = check_scores(X, dim, "budget_bisect")
    budget = _per_row(budget, X, dim, "budget_bisect", "budget")
    if isinstance(budget, float):
        if math.isnan(budget):
            raise ValueError("budget_bisect: budget must not be NaN")
        budget = torch.full((1,) * X.dim(), budget, dtype=compute_dtype(X.dtype), device=X.device)
    if X.numel() == 0:
        return X.clone()
    return _BudgetBisectFunction.apply(X, budget, dim)


class SparsemaxBisect(nn.Module):
    """sparsemax along dim (see sparsemax_bisect).

    Args:
        dim: the dim to normalize along.
        n_iter: accepted for compatibility.
    """

    def __init__(self, dim=-1, n_iter=None):
        super().__init__()
        self.dim = dim
        self.n_iter = n_iter

    def forward(self, X):
        return sparsemax_bisect(X, dim=self.dim, n_iter=self.n_iter)


class EntmaxBisect(nn.Module):
    """alpha-entmax along dim (see entmax_bisect).

    Args:
        alpha: > 0, a float or a tensor (an nn.Parameter is registered, and learned).
        dim: the dim to normalize along.
        n_iter: accepted for compatibility.
    """

    def __init__(self, alpha=1.5, dim=-1, n_iter=50):
        super().__init__()
        self.dim = dim
        self.n_iter = n_iter
        self.alpha = alpha

    def forward(self, X):
        return entmax_bisect(X, alpha=self.alpha, dim=self.dim, n_iter=self.n_iter)


class NormmaxBisect(nn.Module):
    """alpha-normmax along dim (see normmax_bisect).

    Args:
        alpha: > 0, a float or a tensor.
        dim: the dim to normalize along.
        n_iter: accepted for compatibility.
    """

    def __init__(self, alpha=2, dim=-1, n_iter=50):
        super().__init__()
        self.dim = dim
        self.n_iter = n_iter
        self.alpha = alpha

    def forward(self, X):
        return normmax_bisect(X, alpha=self.alpha, dim=self.dim, n_iter=self.n_iter)


class BudgetBisect(nn.Module):
    """budget-sparsemax along dim (see budget_bisect).

    Args:
        budget: a float or a tensor.
        dim: the dim to normalize along.
        n_iter: accepted for compatibility.
    """

    def __init__(self, budget=2, dim=-1, n_iter=50):
        super().__init__()
        self.dim = dim
        self.n_iter = n_iter
        self.budget = budget

    def forward(self, X):
        return budget_bisect(X, budget=self.budget, dim=self.dim, n_iter=self.n_iter)

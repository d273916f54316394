"""alpha-entmax for any alpha >= 1, with gradients for the scores and for alpha.

p_i = [(alpha - 1) z_i - tau]_+ ^ (1 / (alpha - 1)), tau such that sum_i p_i = 1
(Peters et al. 2019; Correia et al. 2019, Proposition 1 for d p / d alpha).
"""

import functools
import math
import numbers

import torch

from fairseq_entmax.normalizers._common import (
    NEWTON_TOLERANCE,
    WHOLE_ROWS,
    as_row_values,
    check_scores,
    check_values,
    compute_dtype,
    map_rows,
    map_rows_backward,
    select_above,
    shift_rows,
    sparse_map_backward,
    uses_sync_free_path,
)
from fairseq_entmax.normalizers.entmax15 import entmax15
from fairseq_entmax.normalizers.softmax import softmax
from fairseq_entmax.normalizers.sparsemax import sparsemax

# The threshold search stops once every row's Newton step is at most NEWTON_TOLERANCE; p is
# then corrected to first order for that last step, which leaves an error of order step^2.
# _MAX_PASSES only bounds a pathological case.
_MAX_PASSES = 64
# The sync-free path makes a fixed number of passes, each row's tau frozen once its step is
# within NEWTON_TOLERANCE: for alpha <= 2 (the plain search) and for any alpha (the
# safeguarded one). Each is the largest number of passes the early-exit search needed on the
# adversarial rows of tests/test_normalizers_sync_free.py (up to 16,384 keys, alpha up to 3),
# with a margin; see docs/normalizers.md.
SYNC_FREE_PASSES = {"plain": 16, "safeguarded": 32}

# On the CPU's early-exit path, the plain search runs on each row's candidates alone (the
# entries above a lower bound of tau, a superset of the support) when they are at most this
# share of a block, divided by torch's number of threads: selecting them costs about what
# one pass over the whole block does, and the operations on selected entries run on one
# thread where the passes over whole rows share out (measurements in benchmarks/RESULTS.md).
# Rows shorter than _SELECT_FROM_KEYS keep whole rows: on them, as in a decoding step, the
# operations that select cost more than the passes save. Below _SELECT_FROM_THREADS threads
# whole rows are kept too, but for rows of _SELECT_FROM_LONG_KEYS keys or more: there the
# selection gains on random scores but costs inside a trained model's training steps (both
# tables in benchmarks/RESULTS.md).
_CANDIDATE_SHARE = 0.5
_SELECT_FROM_KEYS = 80
_SELECT_FROM_THREADS = 2
# Rows this long search on their candidates at any number of threads (benchmarks/RESULTS.md,
# "Blocked attention": a generation step over 1,024 keys).
_SELECT_FROM_LONG_KEYS = 1024
# The depths delta of the lower bound of tau (see _lower_bound_of_tau).
_BOUND_DEPTHS = (0.25, 0.5)

# Rows with alpha - 1 below this are computed as softmax, their limit at alpha = 1. The
# search works on r = (alpha - 1) z - tau, values near 1 whose rounding (eps) is an error of
# eps / (alpha - 1) in the scores, raised to the power 1 / (alpha - 1); softmax is off by a
# multiple of alpha - 1. Below these values softmax's error is the smaller (both measured in
# docs/normalizers.md).
_SOFTMAX_BELOW = {torch.float32: 6e-5, torch.float64: 2.5e-9}
# Rows with alpha - 1 below this get the alpha gradient from _alpha_gradient_near_one: the
# general form divides by (alpha - 1)^2 a difference that cancels (its error is measured in
# docs/normalizers.md). Above it the general form is kept, being cheaper, and the default
# clamp, alpha >= 1.01, never leaves it.
_NEAR_ONE_BELOW = 5e-3


def alpha_entmax_rows(x, out, am1, r, q, rq, at_most_two=False):
    """alpha-entmax of each row of the block x into out, am1 = alpha - 1 per row (m, 1);
    r, q and rq are scratch blocks; at_most_two: alpha is known to be <= 2.

    Rows with am1 == 0 are softmax. Otherwise, with z = am1 * x (row max 0) and
    n = 1 / am1, tau solves sum_i [z_i - tau]_+^n = 1. Newton's method runs on the norm
    F(tau) = ||[z - tau]_+||_n: for alpha <= 2 (n >= 1) F is convex and decreasing, so from
    any tau below the root (-1, or _lower_bound_of_tau) the steps rise monotonically to the
    root without passing it, nearly linearly far from it (F is exactly linear while one
    entry is in the support) and quadratically near it; 4 to 7 passes for attention rows.
    On the early-exit path, in rows of _SELECT_FROM_KEYS keys or more, the search starts
    from the lower bound and its passes run on the candidates alone, the entries above it,
    when they are few (_CANDIDATE_SHARE per thread) and _selects_candidates says so (enough
    threads, or long rows). For alpha > 2 the monotone rise is lost and each step is kept inside
    the bracket [-1, -(1/d)^am1] (bisection otherwise).
    The search stops when every Newton step is below NEWTON_TOLERANCE; p is then computed at
    tau + step (to first order, from the last pass) and divided by its sum. The sync-free
    path makes SYNC_FREE_PASSES passes instead, over every entry, and decides from
    at_most_two, not from alpha's values, which search to run.
    """
    sync_free = uses_sync_free_path(x)
    is_softmax = am1 < _SOFTMAX_BELOW[am1.dtype]
    any_softmax = sync_free or bool(is_softmax.any())
    if any_softmax:
        am1 = am1.masked_fill(is_softmax, 1.0)  # any value: these rows are replaced below
    valid = shift_rows(x, out)
    # tau >= -1, so entries with am1 * z < -1 never enter the support: clamping them to
    # -2 removes -inf and huge magnitudes (1e30) without changing the result.
    z = out.mul_(am1).clamp_min_(-2.0)
    # The plain loop has less than half the operations of the safeguarded one, and their
    # number is what a call on a few short rows (a decoding step) costs.
    plain = at_most_two if sync_free else bool((am1 <= 1.0).all())
    candidates = None
    if plain and not sync_free and z.shape[1] >= _SELECT_FROM_KEYS:
        tau = _lower_bound_of_tau(z, am1, scratch=r)
        threshold = tau if valid is None else tau.masked_fill(~valid, float("inf"))
        if _selects_candidates(z.shape[1]):
            candidates = select_above(z, threshold, _CANDIDATE_SHARE / torch.get_num_threads(), scratch=r)
    else:
        tau = torch.full_like(am1, -1.0)
    if candidates is None:
        newton = _NewtonOnNorm(z, am1, WHOLE_ROWS, (r, q, rq), sync_free)
        newton.write_probabilities(newton.plain(tau) if plain else newton.safeguarded(tau), out)
    else:
        # One pass on the candidates brings tau closer to the root; the entries still
        # above it are the candidates of the passes that follow.
        newton = _NewtonOnNorm.on_selected(z, am1, candidates)
        newton.plain(tau, passes=1)
        candidates = candidates.narrowed(newton.z > candidates.spread(tau))
        newton = _NewtonOnNorm.on_selected(z, am1, candidates)
        step = newton.plain(tau)
        newton.write_probabilities(step, newton.rq)
        candidates.scatter(newton.rq, out)
        # A row with a NaN score has no candidates, and a NaN step.
        nan_rows = torch.isnan(step)
        if bool(nan_rows.any()):
            out.masked_fill_(nan_rows, float("nan"))
    if any_softmax:
        out.copy_(torch.where(is_softmax, torch.softmax(x.to(out.dtype), dim=-1), out))
    if valid is not None:
        out.masked_fill_(~valid, 0.0)


class _NewtonOnNorm:
    """Newton's method on F(tau) - 1 for the rows of z (see alpha_entmax_rows). z holds the
    entries of `rows` (WholeRows: the block; SelectedEntries: some of its entries); scratch:
    three tensors like z. r = [z - tau]_+ and q = r^(n - 1) are left from the last pass, at
    the tau before the step it returns. With sync_free, the searches make a fixed number of
    passes (SYNC_FREE_PASSES), each row frozen once converged."""

    def __init__(self, z, am1, rows, scratch, sync_free):
        self.z, self.am1, self.rows = z, am1, rows
        self.r, self.q, self.rq = scratch
        self.sync_free = sync_free
        exponent = 1.0 / am1 - 1.0  # n - 1
        self.exponent = rows.spread(exponent)
        self.one_minus_am1 = 1.0 - am1
        # For alpha >= 2, n - 1 <= 0 and pow(0, n - 1) is 1 or inf: zero it off the support.
        self.mask_zeros = sync_free or bool((exponent <= 0).any())
        self.tolerance = NEWTON_TOLERANCE[z.dtype]

    @classmethod
    def on_selected(cls, z, am1, selected):
        """On the early-exit path, over the SelectedEntries `selected` of the block z."""
        z = selected.gather(z)
        return cls(z, am1, selected, [torch.empty_like(z) for _ in range(3)], sync_free=False)

    def passes(self, search):
        return SYNC_FREE_PASSES[search] if self.sync_free else _MAX_PASSES

    def converged(self, step):
        """Per row, whether the step is within tolerance; NaN rows count as converged."""
        return ~(step.abs() > self.tolerance)

    def total_and_step(self, tau):
        """sum_i r_i^n (= sum p) and the Newton step (F - 1) / -F' at tau."""
        torch.sub(self.z, self.rows.spread(tau), out=self.r).clamp_min_(0.0)
        torch.pow(self.r, self.exponent, out=self.q)
        if self.mask_zeros:
            self.q.masked_fill_(self.r == 0, 0.0)
        s1 = self.rows.sum(self.q)  # sum r^(n-1)
        # sum r^n, the product written into scratch: vecdot(q, r) would allocate a
        # block-sized temporary at every pass.
        total = self.rows.sum(torch.mul(self.q, self.r, out=self.rq))
        # (F - 1) / -F' = (S - S^(1 - am1)) / S1 with S = sum r^n.
        return total, (total - total.pow(self.one_minus_am1)).div_(s1)

    def plain(self, tau, passes=None):
        """For alpha <= 2, where the steps rise monotonically to the root from any tau below
        it (updated in place); passes: at most this many (default: those of the path)."""
        for _ in range(passes or self.passes("plain")):
            _, step = self.total_and_step(tau)
            converged = self.converged(step)
            if not self.sync_free and bool(converged.all()):
                break
            tau.add_(step.masked_fill(converged, 0.0))
        return step

    def safeguarded(self, tau):
        """For any alpha: steps that would leave the bracket of the root are bisections; tau
        starts at -1 (the bracket's lower end) and is updated in place."""
        lo = torch.full_like(self.am1, -1.0)
        hi = -torch.pow(torch.full_like(self.am1, 1.0 / self.z.shape[1]), self.am1)
        for _ in range(self.passes("safeguarded")):
            total, step = self.total_and_step(tau)
            converged = self.converged(step)
            if not self.sync_free and bool(converged.all()):
                break
            below = total >= 1.0
            lo = torch.where(below, tau, lo)
            hi = torch.where(below, hi, tau)
            new_tau = tau + step
            # Bisect where a step would leave the bracket (or is NaN), except for rows
            # that have already converged: their tiny steps may graze the bracket's ends.
            outside = ~((new_tau > lo) & (new_tau < hi)) & ~converged
            tau.copy_(torch.where(converged, tau, torch.where(outside, (lo + hi) / 2, new_tau)))
        return step

    def write_probabilities(self, step, out):
        """p at tau + step into out (like z), from the last pass's r and q."""
        # To first order: [r - n step]_+ r^(n-1), which leaves an error of order step^2
        # instead of step (and costs no further power); then renormalise.
        torch.sub(self.r, self.rows.spread(step / self.am1), out=out).clamp_min_(0.0).mul_(self.q)
        out.div_(self.rows.spread(self.rows.sum(out)))


def alpha_entmax_threshold(z, am1, masked, scratch, at_most_two=False):
    """The threshold of each row of z: tau with sum_i [z_i - tau]_+^n = 1.

    As alpha_entmax_rows searches, and returns tau instead of p.

    Args:
        z: (m, d) block, am1 * x with row maximum 0 and entries clamped at -2, in the compute
            dtype; no row may be softmax (am1 below _SOFTMAX_BELOW).
        am1: (m, 1) alpha - 1 per row.
        masked: (m, 1) bool, the rows that were all -inf (their tau is not searched for).
        scratch: three blocks like z.
        at_most_two: alpha is known to be <= 2 (the sync-free path's choice of search).

    Returns:
        (m, 1) tau, the search's last step included.
    """
    sync_free = uses_sync_free_path(z)
    plain = at_most_two if sync_free else bool((am1 <= 1.0).all())
    if not plain or sync_free or z.shape[1] < _SELECT_FROM_KEYS:
        tau = torch.full_like(am1, -1.0)
        newton = _NewtonOnNorm(z, am1, WHOLE_ROWS, scratch, sync_free)
        step = newton.plain(tau) if plain else newton.safeguarded(tau)
        return tau.add_(step)
    tau = _lower_bound_of_tau(z, am1, scratch=scratch[0])
    candidates = None
    if _selects_candidates(z.shape[1]):
        threshold = tau.masked_fill(masked, float("inf"))
        candidates = select_above(z, threshold, _CANDIDATE_SHARE / torch.get_num_threads(), scratch=scratch[0])
    if candidates is None:
        return tau.add_(_NewtonOnNorm(z, am1, WHOLE_ROWS, scratch, sync_free).plain(tau))
    newton = _NewtonOnNorm.on_selected(z, am1, candidates)
    newton.plain(tau, passes=1)
    candidates = candidates.narrowed(newton.z > candidates.spread(tau))
    return tau.add_(_NewtonOnNorm.on_selected(z, am1, candidates).plain(tau))


def _selects_candidates(keys):
    """Whether the early-exit search of rows of `keys` keys runs on their candidates: with
    _SELECT_FROM_THREADS threads or more, and at any number of threads in rows of
    _SELECT_FROM_LONG_KEYS keys or more, where the candidates are a small share of the keys."""
    return torch.get_num_threads() >= _SELECT_FROM_THREADS or keys >= _SELECT_FROM_LONG_KEYS


def _lower_bound_of_tau(z, am1, scratch):
    """A lower bound of each row's tau, at least -1 (the bound at z's row maximum, 0);
    scratch: a block like z.

    For a depth delta with c entries of the row above -delta, every tau <= -delta has
    sum_i [z_i - tau]_+^n >= c (-delta - tau)^n, which is 1 at tau = -delta - c^(-am1):
    the root lies above that. Each depth costs one comparison and one sum per entry.
    """
    tau = torch.full_like(am1, -1.0)
    for depth in _BOUND_DEPTHS:
        # The comparison written as 0/1 in the compute dtype: summing a bool block would
        # first copy it to int64.
        count = torch.gt(z, -depth, out=scratch).sum(dim=-1, keepdim=True)
        torch.maximum(tau, -depth - count.pow(-am1), out=tau)
    return tau


def alpha_entmax_rows_backward(p, g, grad_out, am1, need_alpha_grad, log_p, s, product):
    """Gradient of the scores into grad_out; returns d loss / d alpha per row (or None).
    log_p, s and product are scratch blocks (product holds g times another block, which
    vecdot would allocate). On the sync-free path both branches that depend on alpha's
    values are always taken."""
    sync_free = uses_sync_free_path(p)
    # log p with p clamped to the smallest normal number: finite everywhere (and the log of
    # 0 is several times slower than that of a positive number).
    torch.clamp_min(p, torch.finfo(p.dtype).tiny, out=log_p).log_()
    # s = p^(2 - alpha) = p * exp(-am1 log p): exactly 0 where p = 0 ...
    torch.mul(log_p, -am1, out=s).exp_().mul_(p)
    if sync_free or bool((am1 > 1).any()):  # ... unless alpha > 2, where exp overflows
        s.masked_fill_(p == 0, 0.0)
    skewed_mean = sparse_map_backward(g, s, grad_out)  # sum g s / sum s = sum g p~
    if not need_alpha_grad:
        return None
    # Proposition 1, with h = -p log p and H = sum h (both 0 off the support):
    # sum_i g_i [(p_i - p~_i) / am1^2 + (h_i - p~_i H) / am1].
    neg_h = torch.mul(p, log_p, out=s)  # p log p, 0 where p = 0 (log_p is finite)
    entropy = -neg_h.sum(dim=-1, keepdim=True)
    g_h = -torch.mul(g, neg_h, out=product).sum(dim=-1, keepdim=True)
    g_p = torch.mul(g, p, out=product).sum(dim=-1, keepdim=True)
    general = (g_p - skewed_mean) / am1.square() + (g_h - skewed_mean * entropy) / am1
    near_one = am1 < _NEAR_ONE_BELOW
    if not sync_free and not bool(near_one.any()):
        return general
    # (general is inf or NaN at am1 = 0; torch.where drops it there)
    return torch.where(near_one, _alpha_gradient_near_one(p, g, log_p, am1, g_p, g_h, entropy, product), general)


def _alpha_gradient_near_one(p, g, log_p, am1, g_p, g_h, entropy, product):
    """Proposition 1's alpha gradient in a form without cancellation as alpha -> 1.

    With y = -am1 log p, p~ is p e^y / sum(p e^y). Expanding e^y = 1 + y + y^2 phi(y), with
    phi(y) = (e^y - 1 - y) / y^2, the terms of order 1 / am1 of the general form cancel
    exactly, and what is left is
        [(g_p C - g_c) + am1 (g_h C - g_c H)] / (1 + am1 H + am1^2 C),
    with c = p log(p)^2 phi(y), C = sum c, g_c = sum g c (g_p = sum g p, g_h = sum g h).
    At am1 = 0 it is the derivative at alpha = 1, (g_p sum(p log^2 p) - sum(g p log^2 p)) / 2.
    """
    y = log_p * -am1  # >= 0, at most 0.44 (float32) or 3.5 (float64) below _NEAR_ONE_BELOW
    # phi by its series where expm1(y) - y would lose digits, by definition elsewhere.
    series = 0.5 + y * (1 / 6 + y * (1 / 24 + y * (1 / 120 + y * (1 / 720 + y / 5040))))
    phi = torch.where(y < 0.1, series, (torch.expm1(y) - y) / y.square())
    c = phi.mul_(p).mul_(log_p.square())
    c_sum = c.sum(dim=-1, keepdim=True)
    g_c = torch.mul(g, c, out=product).sum(dim=-1, keepdim=True)
    return ((g_p * c_sum - g_c) + am1 * (g_h * c_sum - g_c * entropy)) / (1 + am1 * entropy + am1.square() * c_sum)


class AlphaEntmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, alpha, dim, at_most_two):
        """alpha: a tensor with scores.dim() dims, broadcastable, of size 1 along dim, on
        scores' device; at_most_two: whether alpha is known to be <= 2."""
        ctx.dim = dim
        if scores.numel() == 0:
            out = scores.clone()
        else:
            am1 = as_row_values(alpha, scores, dim, compute_dtype(scores.dtype)) - 1.0
            kernel = functools.partial(alpha_entmax_rows, at_most_two=at_most_two)
            out = map_rows(scores, dim, kernel, row_params=(am1,), num_scratch=3)
        ctx.save_for_backward(out, alpha)
        return out

    @staticmethod
    def backward(ctx, grad):
        out, alpha = ctx.saved_tensors
        need_alpha_grad = ctx.needs_input_grad[1]
        if out.numel() == 0:
            return torch.zeros_like(out), torch.zeros_like(alpha) if need_alpha_grad else None, None, None
        am1 = as_row_values(alpha, out, ctx.dim, compute_dtype(out.dtype)) - 1.0

        def kernel(p, g, grad_out, am1_block, log_p, s, product):
            return alpha_entmax_rows_backward(p, g, grad_out, am1_block, need_alpha_grad, log_p, s, product)

        result = map_rows_backward(
            out, grad, ctx.dim, kernel, row_params=(am1,), num_scratch=3, row_result=need_alpha_grad
        )
        if not need_alpha_grad:
            return result, None, None, None
        grad_scores, grad_alpha = result
        return grad_scores, grad_alpha.sum_to_size(alpha.shape).to(alpha.dtype), None, None


def _check_alpha(alpha, scores, dim, max_alpha):
    """Validate alpha; return it as a float or as a tensor with scores.dim() dims on scores'
    device (values checked on the device on the sync-free path)."""
    upper = math.inf if max_alpha is None else max_alpha
    allowed = (
        "alpha must be >= 1 (1 = softmax, 1.5 = entmax15, 2 = sparsemax), given as a finite "
        "float or a floating tensor broadcastable to scores with size 1 along dim"
        # (max_alpha not formatted: under torch.compile(dynamic=True) it is a symbolic float)
        + ("" if max_alpha is None else ", and at most max_alpha")
    )
    if isinstance(alpha, numbers.Real) and not isinstance(alpha, bool):
        alpha = float(alpha)
        if not (math.isfinite(alpha) and 1.0 <= alpha <= upper):
            raise ValueError(f"alpha_entmax: got alpha={alpha}; {allowed}")
        return alpha
    if not (torch.is_tensor(alpha) and alpha.is_floating_point()):
        raise ValueError(f"alpha_entmax: got alpha of type {type(alpha).__name__}; {allowed}")
    if alpha.dim() > scores.dim():
        raise ValueError(
            f"alpha_entmax: alpha has shape {tuple(alpha.shape)}, more dims than scores "
            f"{tuple(scores.shape)}; {allowed}"
        )
    full = alpha.reshape((1,) * (scores.dim() - alpha.dim()) + tuple(alpha.shape))
    # Checked by hand: torch.broadcast_shapes imports torch's symbolic-shapes machinery on
    # its first call, a delay in every process's first attention call.
    fits = all(size in (1, scores_size) for size, scores_size in zip(full.shape, scores.shape))
    if not fits or full.shape[dim] != 1:
        raise ValueError(
            f"alpha_entmax: alpha of shape {tuple(alpha.shape)} does not fit scores of shape "
            f"{tuple(scores.shape)} with dim={dim}; {allowed}"
        )
    full = full.to(scores.device)
    in_range = (full >= 1.0) & (full <= upper) & (full < math.inf)  # NaN fails them all
    check_values(full, in_range, "alpha_entmax: alpha contains {value}; " + allowed)
    return full


def alpha_entmax(scores, alpha, dim=-1, max_alpha=None):
    """alpha-entmax along `dim`, differentiable w.r.t. scores and alpha.

    Args:
        scores: floating tensor of any shape.
        alpha: >= 1, a float, or a tensor broadcastable to scores with size 1 along dim
            (for example one alpha per head: shape (1, heads, 1, 1) against scores of shape
            (batch, heads, queries, keys)), on any device (it is moved to scores') and in
            any floating dtype (half precision is computed in float32; its gradient comes
            back in alpha's dtype). alpha = 1 is softmax, 2 is sparsemax, 1.5 is entmax15;
            a python float equal to one of these uses that exact map.
        dim: the dim to normalise along.
        max_alpha: an upper bound on alpha known in advance, such as the clamp of a
            learned alpha. The sync-free path (see sync_free) cannot read alpha's values
            to choose its search: with max_alpha <= 2 it runs the plain Newton search
            (16 passes), otherwise the safeguarded one (32 passes). A larger alpha is an
            error.

    Returns:
        A tensor of scores' shape and dtype, non-negative, summing to 1 along dim.

    The threshold is found by Newton steps (bracketed for alpha > 2; see alpha_entmax_rows)
    that stop once every step on tau is below 1e-5 (float32) or 1e-12 (float64), usually
    after 4 to 7 passes; p is then corrected to first order for the last step and
    renormalised (on the sync-free path: a fixed number of passes, see max_alpha). Accuracy,
    max abs error of p against float64 bisection run to convergence on attention-like rows
    (tests/test_normalizers_properties.py, both paths): float32 below 1e-6 for
    1.01 <= alpha <= 2 and below 3e-6 for 2 < alpha <= 3 (on adversarial rows at alpha = 3,
    up to 2e-4: tests/test_normalizers_sync_free.py); float64 below 1e-13. Closer
    to alpha = 1, rounding costs about 7e-9 / (alpha - 1) in float32 (1e-17 / (alpha - 1) in
    float64), so rows with alpha - 1 below 6e-5 (float32) or 2.5e-9 (float64) are computed
    as softmax, the limit, which is off by about 2 (alpha - 1): for 1 <= alpha < 1.01, below
    1.5e-4 in float32 and 1e-8 in float64. The alpha gradient keeps its precision down to
    alpha = 1 (below alpha = 1.005 it takes a form without the general one's cancellation).

    -inf scores get weight and gradient exactly 0; an all -inf row gives zeros.
    float16/bfloat16 inputs are computed in float32 and returned in their own dtype.
    """
    dim = check_scores(scores, dim, "alpha_entmax")
    if max_alpha is not None and not (isinstance(max_alpha, numbers.Real) and max_alpha >= 1.0):
        raise ValueError(f"alpha_entmax: max_alpha must be a number >= 1 or None, got {max_alpha!r}")
    alpha = _check_alpha(alpha, scores, dim, max_alpha)
    if isinstance(alpha, float):
        if alpha == 1.0:
            return softmax(scores, dim)
        if alpha == 1.5:
            return entmax15(scores, dim)
        if alpha == 2.0:
            return sparsemax(scores, dim)
        max_alpha = alpha if max_alpha is None else max_alpha
        alpha = torch.full((1,) * scores.dim(), alpha, dtype=compute_dtype(scores.dtype), device=scores.device)
    at_most_two = max_alpha is not None and max_alpha <= 2.0
    return AlphaEntmaxFunction.apply(scores, alpha, dim, at_most_two)

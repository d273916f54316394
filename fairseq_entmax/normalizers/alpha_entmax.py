"""alpha-entmax for any alpha >= 1, with gradients for the scores and for alpha.

p_i = [(alpha - 1) z_i - tau]_+ ^ (1 / (alpha - 1)), tau such that sum_i p_i = 1
(Peters et al. 2019; Correia et al. 2019, Proposition 1 for d p / d alpha).
"""
import math
import numbers

import torch

from fairseq_entmax.normalizers._common import check_scores, compute_dtype, shift_by_row_max
from fairseq_entmax.normalizers.entmax15 import entmax15
from fairseq_entmax.normalizers.softmax import softmax, softmax_forward
from fairseq_entmax.normalizers.sparsemax import sparse_map_backward, sparsemax

# Root finding stops when every row's Newton step is below this (in units of tau, which
# lies in [-1, 0]); MAX_ITER only guards against a pathological non-converging case.
_TOLERANCE = {torch.float32: 1e-6, torch.float64: 1e-13}
_MAX_ITER = 50


def _powered_sums(z, tau, n):
    """S = sum_i r_i^n and S1 = sum_i r_i^(n-1) over r = [z - tau]_+ (last dim)."""
    r = (z - tau).clamp_min_(0.0)
    r_pow = r.pow(n - 1)
    if bool((n <= 1).any()):
        # alpha >= 2: the exponent n - 1 <= 0 and pow(0, n - 1) is 1 or inf, not 0.
        r_pow.masked_fill_(r == 0, 0.0)
    s1 = r_pow.sum(dim=-1, keepdim=True)
    s = torch.linalg.vecdot(r_pow, r).unsqueeze(-1)
    return s, s1


def alpha_entmax_threshold(z, am1):
    """tau with sum_i [z_i - tau]_+^(1/am1) = 1 along the last dim (rows of z have max 0).

    Newton's method on F(tau) = ||[z - tau]_+||_n - 1 with n = 1 / am1. F is a norm of a
    vector that is convex in tau, hence convex and decreasing for n >= 1 (alpha <= 2):
    started at the lower end of the bracket it climbs monotonically to the root, nearly
    linearly far from it (F is exactly linear while one entry is in the support) and
    quadratically close to it. Each step is kept inside the bracket
    [-1, -(1/d)^am1] (bisection otherwise), which also covers alpha > 2.
    """
    d = z.shape[-1]
    n = 1.0 / am1
    lo = torch.full_like(am1, -1.0)
    hi = -torch.pow(torch.full_like(am1, 1.0 / d), am1)
    tau = lo.clone()
    tol = _TOLERANCE[z.dtype]
    for _ in range(_MAX_ITER):
        s, s1 = _powered_sums(z, tau, n)
        above = s >= 1.0  # f(tau) >= 0: tau is at or below the root
        lo = torch.where(above, tau, lo)
        hi = torch.where(above, hi, tau)
        # Newton step on F: (F - 1) / -F' = (S - S^(1 - am1)) / S1.
        step = (s - s.pow(1.0 - am1)) / s1
        new_tau = tau + step
        outside = (new_tau <= lo) | (new_tau >= hi) | ~torch.isfinite(new_tau)
        new_tau = torch.where(outside, (lo + hi) / 2, new_tau)
        converged = bool(((new_tau - tau).abs() <= tol).all())
        tau = new_tau
        if converged:
            break
    return tau


def alpha_entmax_forward(x, alpha):
    """alpha-entmax along the last dim of x; alpha broadcasts against x with size 1 there."""
    z, valid = shift_by_row_max(x)
    alpha = alpha.to(x.dtype).expand(*x.shape[:-1], 1)
    is_softmax = alpha == 1.0
    # Rows with alpha == 1 are softmax; give them a harmless am1 for the general path.
    am1 = torch.where(is_softmax, torch.ones_like(alpha), alpha - 1.0)
    # tau >= -1 for (alpha - 1) * z, so entries below -1 are never in the support:
    # clamping at -2 removes -inf and 1e30 without changing p.
    z = (z * am1).clamp_min_(-2.0)
    tau = alpha_entmax_threshold(z, am1)
    p = (z - tau).clamp_min_(0.0).pow_(1.0 / am1)
    # Renormalise: the root is found to a tolerance, the simplex constraint is then exact
    # up to rounding.
    p.div_(p.sum(dim=-1, keepdim=True))
    if bool(is_softmax.any()):
        p = torch.where(is_softmax, softmax_forward(x, -1), p)
    return p.mul_(valid)


def _alpha_entmax_backward(grad, p, alpha, need_alpha_grad):
    """Gradients w.r.t. scores and (per row) alpha, from the output p only."""
    am1 = alpha - 1.0
    is_softmax = am1 == 0
    positive = p > 0
    # s = p^(2 - alpha) on the support, 0 elsewhere (pow(0, 0) would be 1 at alpha = 2).
    s = torch.where(positive, p.pow(2.0 - alpha), torch.zeros_like(p))
    grad_scores = sparse_map_backward(grad, s)
    if not need_alpha_grad:
        return grad_scores, None
    log_p = torch.where(positive, p.log(), torch.zeros_like(p))
    h = -p * log_p  # entropy terms, 0 off the support
    entropy = h.sum(dim=-1, keepdim=True)
    g_p = torch.linalg.vecdot(grad, p).unsqueeze(-1)
    g_h = torch.linalg.vecdot(grad, h).unsqueeze(-1)
    g_skewed = torch.linalg.vecdot(grad, s).unsqueeze(-1) / s.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    # Proposition 1, alpha > 1: sum_i g_i [(p_i - p~_i) / am1^2 + (h_i - p~_i H) / am1].
    safe_am1 = torch.where(is_softmax, torch.ones_like(am1), am1)
    grad_alpha = (g_p - g_skewed) / safe_am1.square() + (g_h - g_skewed * entropy) / safe_am1
    if bool(is_softmax.any()):
        # alpha = 1 limit: sum_i g_i (h_i log p_i - p_i sum_j h_j log p_j) / 2.
        h_log_p = h * log_p
        limit = (torch.linalg.vecdot(grad, h_log_p).unsqueeze(-1)
                 - g_p * h_log_p.sum(dim=-1, keepdim=True)) / 2
        grad_alpha = torch.where(is_softmax, limit, grad_alpha)
    return grad_scores, grad_alpha


class AlphaEntmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, alpha, dim):
        """alpha: a tensor of scores.dim() dims, broadcastable, of size 1 along dim."""
        x = scores.movedim(dim, -1)
        a = alpha.movedim(dim, -1)
        ctx.dim = dim
        ctx.alpha_shape = alpha.shape
        if x.numel() == 0:
            out = scores.clone()
        else:
            work_dtype = compute_dtype(x.dtype)
            out = alpha_entmax_forward(x.to(work_dtype), a.to(work_dtype))
            out = out.to(x.dtype).movedim(-1, dim)
        ctx.save_for_backward(out, alpha)
        return out

    @staticmethod
    def backward(ctx, grad):
        out, alpha = ctx.saved_tensors
        need_alpha_grad = ctx.needs_input_grad[1]
        if out.numel() == 0:
            grad_alpha = torch.zeros_like(alpha) if need_alpha_grad else None
            return torch.zeros_like(out), grad_alpha, None
        work_dtype = compute_dtype(out.dtype)
        p = out.movedim(ctx.dim, -1).to(work_dtype)
        a = alpha.movedim(ctx.dim, -1).to(work_dtype).expand(*p.shape[:-1], 1)
        g = grad.movedim(ctx.dim, -1).to(work_dtype)
        grad_scores, grad_alpha = _alpha_entmax_backward(g, p, a, need_alpha_grad)
        grad_scores = grad_scores.to(out.dtype).movedim(-1, ctx.dim)
        if grad_alpha is not None:
            grad_alpha = grad_alpha.movedim(-1, ctx.dim).sum_to_size(ctx.alpha_shape).to(alpha.dtype)
        return grad_scores, grad_alpha, None


def _check_alpha(alpha, scores, dim):
    """Validate alpha; return it as a tensor with scores.dim() dims (or a python float)."""
    allowed = (
        "alpha must be >= 1 (1 = softmax, 1.5 = entmax15, 2 = sparsemax), given as a finite "
        "float or a floating tensor broadcastable to scores with size 1 along dim"
    )
    if isinstance(alpha, numbers.Real) and not isinstance(alpha, bool):
        alpha = float(alpha)
        if not (math.isfinite(alpha) and alpha >= 1.0):
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
    try:
        broadcast = torch.broadcast_shapes(full.shape, scores.shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores.shape or full.shape[dim] != 1:
        raise ValueError(
            f"alpha_entmax: alpha of shape {tuple(alpha.shape)} does not fit scores of shape "
            f"{tuple(scores.shape)} with dim={dim}; {allowed}"
        )
    bad = torch.isnan(alpha) | (alpha < 1.0) | torch.isinf(alpha)
    if bool(bad.any()):
        first_bad = alpha.detach().flatten()[bad.flatten()][0].item()
        raise ValueError(f"alpha_entmax: alpha contains {first_bad}; {allowed}")
    return full


def alpha_entmax(scores, alpha, dim=-1):
    """alpha-entmax along `dim`, differentiable w.r.t. scores and alpha.

    alpha >= 1: a float, or a tensor broadcastable to scores with size 1 along dim (for
    example one alpha per head, shape (heads, 1, 1) against (batch, heads, queries, keys)).
    alpha = 1 is softmax, 2 is sparsemax, 1.5 is entmax15.

    The threshold tau is found by safeguarded Newton steps on a norm (see
    alpha_entmax_threshold) that stop once every step is below 1e-6 (float32) or 1e-13
    (float64), then p is renormalised to sum to 1.

    -inf scores get weight and gradient exactly 0; an all -inf row gives zeros.
    float16/bfloat16 inputs are computed in float32 and returned in their own dtype.
    """
    check_scores(scores, dim, "alpha_entmax")
    alpha = _check_alpha(alpha, scores, dim)
    if isinstance(alpha, float):
        # A fixed alpha with a closed form uses it: exact and faster.
        if alpha == 1.0:
            return softmax(scores, dim)
        if alpha == 1.5:
            return entmax15(scores, dim)
        if alpha == 2.0:
            return sparsemax(scores, dim)
        alpha = torch.tensor(alpha, dtype=compute_dtype(scores.dtype), device=scores.device)
        alpha = alpha.reshape((1,) * scores.dim())
    return AlphaEntmaxFunction.apply(scores, alpha, dim)

"""1.5-entmax (Peters, Niculae, Martins 2019): p_i = [z_i / 2 - tau]_+^2, sum_i p_i = 1."""

import torch

from fairseq_entmax.normalizers._common import (
    NEWTON_TOLERANCE,
    WIDE_BLOCK_SCALE,
    check_scores,
    output_only_backward,
    output_only_forward,
    shift_rows,
    sparse_map_backward,
    uses_sync_free_path,
)

# Only bounds a pathological case: the search stops at NEWTON_TOLERANCE.
_MAX_PASSES = 64
# Newton passes after the sorted threshold on the sync-free path: the closed form's
# rounding (cancellation in the spread) is far inside the quadratic convergence region.
_POLISHING_PASSES = 2


def entmax15_rows(x, out, r):
    """1.5-entmax of each row of the block x into out; r is a scratch block.

    The threshold tau solves sum_i [z_i - tau]_+^2 = 1 (z = x / 2, row max 0), found by
    Newton's method on the norm F(tau) = ||[z - tau]_+||_2 without sorting. F is convex and
    decreasing, so from tau = -1 (below the root) the steps rise monotonically to the root
    without passing it; F is nearly linear, so the steps are long far from the root, and
    near it convergence is quadratic (3 to 6 passes on attention rows). Each pass is two
    elementwise operations and two row sums over the block, and a handful on one value per
    row: that handful is what a decoding step, a few short rows, mostly costs. The search
    stops when every step is below NEWTON_TOLERANCE; p is computed at tau + step and
    renormalised. On the sync-free path the search starts instead from the exact threshold
    of the sorted entries and makes _POLISHING_PASSES passes.
    """
    valid = shift_rows(x, out)
    # tau >= max / 2 - 1 = -1, so entries with z / 2 < -1 never enter the support: clamping
    # them to -2 removes -inf and huge magnitudes (1e30) without changing the result.
    z = out.mul_(0.5).clamp_min_(-2.0)
    z.sub_(entmax15_threshold(z, r)).clamp_min_(0.0).square_()
    out.div_(out.sum(dim=-1, keepdim=True))
    if valid is not None:
        out.masked_fill_(~valid, 0.0)


def entmax15_threshold(z, r):
    """tau of each row of z (x / 2 with row maximum 0, entries clamped at -2) by the Newton
    search of entmax15_rows, or on the sync-free path from the sorted entries and
    _POLISHING_PASSES passes; r is a scratch block."""
    if uses_sync_free_path(z):
        tau = entmax15_threshold_by_sorting(z)
        for _ in range(_POLISHING_PASSES):
            tau.add_(_newton_step(z, tau, r))
        return tau
    tolerance = NEWTON_TOLERANCE[z.dtype]
    tau = z.new_full((z.shape[0], 1), -1.0)
    for _ in range(_MAX_PASSES):
        step = _newton_step(z, tau, r)
        tau.add_(step)
        if not bool((step.abs() > tolerance).any()):  # (NaN rows count as converged)
            break
    return tau


def _newton_step(z, tau, r):
    """The Newton step on tau at tau (r: scratch, left holding [z - tau]_+)."""
    torch.sub(z, tau, out=r).clamp_min_(0.0)
    s1 = r.sum(dim=-1, keepdim=True)
    # (vecdot(r, r) would allocate r * r: a block-sized temporary at every pass)
    s2 = torch.linalg.vector_norm(r, dim=-1, keepdim=True).square_()
    # (F - 1) / -F' with F = sqrt(s2) and F' = -s1 / F; s1 > 0, as the row max (z = 0)
    # stays in the support while tau < 0.
    return (s2 - s2.sqrt()).div_(s1)


def entmax15_threshold_by_sorting(z):
    """tau of each row of z from its sorted entries: with the k largest as the support, tau
    solves sum (z_i - tau)^2 = 1 in closed form; the support is the largest k whose tau is
    at most the k-th largest entry (Peters et al. 2019, Algorithm 2). Exact up to the
    rounding of the closed form, which the Newton passes that follow remove."""
    d = z.shape[-1]
    ordered = torch.sort(z, dim=-1, descending=True).values
    ranks = torch.arange(1, d + 1, dtype=z.dtype, device=z.device)
    mean = ordered.cumsum(dim=-1) / ranks
    mean_of_squares = ordered.square().cumsum(dim=-1) / ranks
    spread = ranks * (mean_of_squares - mean.square())
    candidates = mean - ((1.0 - spread) / ranks).clamp_min(0.0).sqrt()
    size = (candidates <= ordered).sum(dim=-1, keepdim=True).clamp_min_(1)
    return candidates.gather(-1, size - 1)


def entmax15_rows_backward(p, g, grad_out, s):
    """Jacobian diag(s) - s s^T / sum(s) with s = p^(2 - alpha) = sqrt(p)."""
    # p / sqrt(max(p, tiny)): exactly 0 off the support, and avoids sqrt(0), which is
    # several times slower than sqrt of a positive number.
    torch.clamp_min(p, torch.finfo(p.dtype).tiny, out=s).rsqrt_().mul_(p)
    sparse_map_backward(g, s, grad_out)


class Entmax15Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, dim):
        return output_only_forward(ctx, scores, dim, entmax15_rows, block_scale=WIDE_BLOCK_SCALE)

    @staticmethod
    def backward(ctx, grad):
        return output_only_backward(ctx, grad, entmax15_rows_backward), None


def entmax15(scores, dim=-1):
    """1.5-entmax along `dim` (alpha-entmax with alpha = 1.5).

    The threshold is found by Newton steps (see entmax15_rows), usually 3 to 6 passes.
    Accuracy, max abs error of p against an exact sort-based float64 reference
    (tests/test_normalizers_properties.py): float32 below 1e-6, float64 below 1e-13.

    -inf scores get weight and gradient exactly 0; an all -inf row gives zeros.
    float16/bfloat16 inputs are computed in float32 and returned in their own dtype.
    """
    dim = check_scores(scores, dim, "entmax15")
    return Entmax15Function.apply(scores, dim)

"""sparsemax (Martins & Astudillo 2016): the Euclidean projection onto the simplex,
p_i = [z_i - tau]_+ with tau such that sum_i p_i = 1."""

import torch

from fairseq_entmax.normalizers._common import (
    WIDE_BLOCK_SCALE,
    check_scores,
    output_only_backward,
    output_only_forward,
    shift_rows,
    sparse_map_backward,
    uses_sync_free_path,
)


def sparsemax_rows(x, out, r):
    """sparsemax of each row of the block x into out; r is a scratch block.

    The threshold is found exactly without sorting, by Michelot's algorithm: from a tau
    below the root, tau <- (sum of the entries above tau - 1) / (their count). This is
    Newton's method on the piecewise linear, convex, decreasing f(tau) = sum [z - tau]_+ - 1,
    so tau rises monotonically and never passes the root; once the count no longer
    changes, tau solves the equation on the true support and is the exact threshold.
    Each pass is a few operations on a block that stays in cache; attention rows need
    4 to 7 passes. On the sync-free path the threshold comes from sorting instead.
    """
    valid = shift_rows(x, out)
    # tau >= max - 1 = -1, so entries below -1 never enter the support: clamping them to
    # -2 removes -inf and huge magnitudes (1e30) without changing the result.
    z = out.clamp_min_(-2.0)
    z.sub_(sparsemax_threshold(z, r)).clamp_min_(0.0)
    if valid is not None:
        out.masked_fill_(~valid, 0.0)


def sparsemax_threshold(z, r):
    """tau of each row of z (row maximum 0, entries clamped at -2), exactly: by Michelot's
    passes on the early-exit path, by sorting on the sync-free path; r is a scratch block."""
    return sparsemax_threshold_by_sorting(z) if uses_sync_free_path(z) else _michelot_threshold(z, r)


def _michelot_threshold(z, r):
    """tau of each row of z by Michelot's passes, stopping once no row's support changes."""
    tau = z.new_full((z.shape[0], 1), -1.0)
    count = None
    for _ in range(z.shape[1] + 1):  # the support shrinks at each pass: at most d + 1
        torch.sub(z, tau, out=r).clamp_min_(0.0)
        total = r.sum(dim=-1, keepdim=True)
        # sign: far cheaper than r > 0; a NaN row counts 0 (its tau is NaN either way), so
        # that it does not keep the others searching.
        new_count = r.sign_().sum(dim=-1, keepdim=True).nan_to_num_(nan=0.0)
        if count is not None and torch.equal(new_count, count):
            break
        tau = tau + (total - 1.0) / new_count
        count = new_count
    return tau


def sparsemax_threshold_by_sorting(z):
    """tau of each row of z, exactly, from its sorted entries: the support is the k largest
    entries for the largest k with 1 + k z_(k) > z_(1) + ... + z_(k) (Held et al. 1974)."""
    d = z.shape[-1]
    ordered = torch.sort(z, dim=-1, descending=True).values
    excess = ordered.cumsum(dim=-1).sub_(1.0)
    ranks = torch.arange(1, d + 1, dtype=z.dtype, device=z.device)
    # at least 1: a NaN row, where every comparison fails, takes a NaN threshold anyway
    size = (ordered * ranks > excess).sum(dim=-1, keepdim=True).clamp_min_(1)
    return excess.gather(-1, size - 1) / size.to(z.dtype)


def sparsemax_rows_backward(p, g, grad_out, s):
    """Jacobian diag(s) - s s^T / |support| with s the support indicator."""
    torch.sign(p, out=s)
    sparse_map_backward(g, s, grad_out)


class SparsemaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, dim):
        return output_only_forward(ctx, scores, dim, sparsemax_rows, block_scale=WIDE_BLOCK_SCALE)

    @staticmethod
    def backward(ctx, grad):
        return output_only_backward(ctx, grad, sparsemax_rows_backward), None


def sparsemax(scores, dim=-1):
    """sparsemax along `dim`: argmin_p ||p - scores||^2 over the simplex (exact threshold).

    -inf scores get weight and gradient exactly 0; an all -inf row gives zeros.
    float16/bfloat16 inputs are computed in float32 and returned in their own dtype.
    """
    dim = check_scores(scores, dim, "sparsemax")
    return SparsemaxFunction.apply(scores, dim)
